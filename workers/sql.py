"""Every statement the workers app writes by hand, built from its models' tables and fields.

Raw where a benchmark showed the ORM's compiling cost more than running the statement: the
key lookup every authenticated call makes, the pop's check-in and the stale pass's abort
counting. Each is built once (`cache`), after the models are loaded.
"""

from functools import cache

from hordeops.rows import columns
from workers.models import ANONYMOUS_API_KEY_HASH, Account, SharedKey, Worker


@cache
def account_for_api_key() -> str:
    """The account of one key hash (`%s`)."""
    return f"SELECT {columns(Account)} FROM {Account._meta.db_table} WHERE api_key_hash = %s"


@cache
def spend_shared_key() -> str:
    """Take %(cost)s off the shared key %(id)s's budget and add it to what it has used, if it
    has not expired by %(now)s and its budget (unless unlimited) covers it. Returns whether it
    was spent, and the key's budget and expiry as they stood (NULL: no such key), for the
    refusal's words.

    Run by the queueing of a request under its owner's lock (`kudos.sql.LOCK_ACCOUNT`), so
    that two requests cannot both spend the last of it; its own WHERE is checked again on a
    row another transaction changed meanwhile (an owner's PATCH), so it never spends past it.
    """
    table = SharedKey._meta.db_table
    unlimited = SharedKey.UNLIMITED
    return f"""
        WITH spent AS (
            UPDATE {table} SET
                kudos = CASE WHEN kudos = {unlimited} THEN kudos ELSE kudos - %(cost)s END,
                utilized = utilized + %(cost)s
            WHERE id = %(id)s AND kudos <> 0 AND (kudos = {unlimited} OR kudos >= %(cost)s)
              AND (expiry IS NULL OR expiry > %(now)s)
            RETURNING 1
        )
        SELECT EXISTS (SELECT FROM spent), k.kudos, k.expiry
        FROM (SELECT) AS o LEFT JOIN {table} AS k ON k.id = %(id)s
    """


# What a worker declares at each pop, and the same as the statement's typed parameters.
DECLARED = (
    "served_models",
    "max_length",
    "max_context_length",
    "threads",
    "nsfw",
    "chat",
    "bridge_agent",
    "tools",
    "structured_outputs",
)
_DECLARED_NOW = (
    "%(served_models)s::varchar[], %(max_length)s::integer, %(max_context_length)s::integer, "
    "%(threads)s::smallint, %(nsfw)s::boolean, %(chat)s::boolean, %(bridge_agent)s::varchar, "
    "%(tools)s::boolean, %(structured_outputs)s::boolean"
)


# The workers the caller may run (`Account.workers_allowed`): a new name is refused past it.
_WORKERS_ALLOWED = (
    "COALESCE(caller.worker_limit, CASE WHEN caller.trusted THEN %(worker_limit_trusted)s "
    "ELSE %(worker_limit_untrusted)s END)"
)


# Workers of untrusted accounts from the pop's address (`limit_address`; NULL: not limited) that
# a new name of an untrusted caller may join: fewer than the limit, or than the caller's own.
_ADDRESS_ROOM = (
    "(caller.trusted OR %(limit_address)s::varchar IS NULL OR ("
    "SELECT count(*) FROM {worker} AS there JOIN {account} AS owner ON owner.id = there.account_id "
    "WHERE there.address = %(limit_address)s::varchar AND there.deleted_at IS NULL AND NOT owner.trusted"
    ") < GREATEST(%(worker_limit_per_address)s, COALESCE(caller.worker_limit, 0)))"
)


@cache
def check_in() -> str:
    """Authenticate a pop's key and find, create or update the worker it names.

    `caller` is the key's account (no row: an unknown key, so no row at all); `current` the
    worker row as it stands; `written` the upsert, tried unless the caller is anonymous or the
    row is the caller's, its last pop fresh, no goodbye since (`left_at`, which the upsert
    clears: the pop brings it back online) and its declarations unchanged, or the caller is
    suspended (its workers are not kept online by pops it is refused); a new name only when
    `may_create` (after `lock_new_name`, in its transaction) and while the caller runs fewer
    workers than it may (`Account.workers_allowed`) and, for an untrusted caller, its address
    has room (`_ADDRESS_ROOM`). An upsert on
    another account's name writes nothing (its WHERE), and the row returned is then that
    account's. Authenticating here saves the pop a round trip of its own. Columns left out of
    the INSERT take their database defaults (the models' `db_default`).
    """
    worker = Worker._meta.db_table
    return f"""
    WITH caller AS (
        SELECT {columns(Account)} FROM {Account._meta.db_table} WHERE api_key_hash = %(api_key_hash)s
    ),
    current AS (
        SELECT {columns(Worker)} FROM {worker} WHERE name = %(name)s AND deleted_at IS NULL
    ),
    written AS (
        INSERT INTO {worker} (id, name, account_id, {", ".join(DECLARED)}, address, created_at, last_pop_at)
        SELECT gen_random_uuid(), %(name)s, caller.id, {_DECLARED_NOW}, %(address)s::varchar, %(now)s, %(now)s
        FROM caller
        WHERE caller.api_key_hash <> '{ANONYMOUS_API_KEY_HASH}' AND caller.suspended_at IS NULL
          AND (EXISTS (SELECT FROM current) OR (%(may_create)s::boolean AND (
              SELECT count(*) FROM {worker} AS mine
              WHERE mine.account_id = caller.id AND mine.deleted_at IS NULL
          ) < {_WORKERS_ALLOWED} AND {_ADDRESS_ROOM.format(worker=worker, account=Account._meta.db_table)}))
          AND NOT EXISTS (
            SELECT FROM current AS c
            WHERE c.account_id = caller.id
              AND c.last_pop_at > %(fresh_since)s AND c.last_pop_at <= %(now)s AND c.left_at IS NULL
              AND c.address = %(address)s::varchar
              AND ({", ".join(f"c.{field}" for field in DECLARED)}) IS NOT DISTINCT FROM ({_DECLARED_NOW})
        )
        ON CONFLICT (name) WHERE deleted_at IS NULL DO UPDATE SET
            {", ".join(f"{field} = EXCLUDED.{field}" for field in DECLARED)},
            address = EXCLUDED.address,
            last_pop_at = EXCLUDED.last_pop_at,
            left_at = NULL
        WHERE {worker}.account_id = EXCLUDED.account_id
        RETURNING {columns(Worker)}
    ),
    worker AS (
        SELECT * FROM written
        UNION ALL
        SELECT * FROM current WHERE NOT EXISTS (SELECT FROM written)
    )
    SELECT {columns(Account, "caller")}, {columns(Worker, "worker")} FROM caller LEFT JOIN worker ON true
"""


@cache
def lock_new_name() -> str:
    """Lock the caller's account row (`account_id`) and, unless `address_lock` is NULL (the
    function is strict: no lock), a transaction-scoped advisory lock on its address.

    Taken before a new name's check-in, in its transaction: a statement counts from the
    snapshot it starts with, so concurrent first pops each counted the others' workers out and
    all passed the limits. Under these locks the check-in that follows counts every worker
    created before it. A known name's pop never takes them.
    """
    return (
        "SELECT pg_advisory_xact_lock(hashtextextended(%(address_lock)s, 0)) "
        f"FROM {Account._meta.db_table} WHERE id = %(account_id)s FOR UPDATE"
    )


@cache
def count_aborts() -> str:
    """Add aborts to workers (`ids`, `added`) in their window, into maintenance past the threshold.

    Every value is computed from the worker row itself (no self-join), so two passes or a
    faulted submit racing the pass both count. The window is `Worker.ABORT_WINDOW`'s one
    reading, as `Worker.aborts_in_window` reads it: `window_start` is now minus it. Each
    worker's row comes back with whether it went past the threshold now (its count reset to 0:
    `added` is at least 1, so nothing else leaves it at 0).
    """
    expired = "(w.aborts_window_start IS NULL OR w.aborts_window_start < %(window_start)s)"
    new = f"(CASE WHEN {expired} THEN v.added ELSE w.aborted_jobs + v.added END)"
    over = f"({new} > %(threshold)s)"
    return f"""
        UPDATE {Worker._meta.db_table} AS w SET
          aborted_jobs = CASE WHEN {over} THEN 0 ELSE {new} END,
          aborts_window_start = CASE WHEN {expired} THEN %(now)s ELSE w.aborts_window_start END,
          uncompleted_jobs = w.uncompleted_jobs + v.added,
          given_back = w.given_back + CASE WHEN %(given_back)s THEN v.added ELSE 0 END,
          maintenance = w.maintenance OR {over},
          maintenance_reason = CASE WHEN NOT w.maintenance AND {over}
                                    THEN %(reason)s ELSE w.maintenance_reason END
        FROM (SELECT unnest(%(ids)s::uuid[]) AS id, unnest(%(added)s::int[]) AS added) AS v
        WHERE w.id = v.id
        RETURNING w.id, w.account_id, w.name, w.maintenance, w.aborted_jobs = 0,
          w.given_back, w.completed_jobs
        """
