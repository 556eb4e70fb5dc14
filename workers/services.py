from datetime import datetime

from hordeops import errors
from hordeops.rows import columns, fetch_instances
from workers.capacity import check_in_fresh_since
from workers.models import ANONYMOUS_API_KEY_HASH, Account, Worker, hash_api_key, new_api_key


def create_account(*, name: str, trusted: bool = False) -> tuple[Account, str]:
    """Create an account and return it with its API key, which is stored only hashed."""
    api_key = new_api_key()
    account = Account.objects.create(name=name, trusted=trusted, api_key_hash=hash_api_key(api_key))
    return account, api_key


def authenticate(*, api_key: str | None) -> Account:
    account = Account.objects.for_api_key(required_api_key(api_key))
    if account is None:
        raise errors.InvalidAPIKey()
    return account


def required_api_key(api_key: str | None) -> str:
    """The key as sent, refused if it is missing or empty (before any query)."""
    if not api_key:
        raise errors.InvalidAPIKey("This route needs an API key in the apikey header.")
    return api_key


def check_in_worker(
    *,
    api_key: str | None,
    name: str,
    served_models: list[str],
    max_length: int,
    max_context_length: int,
    threads: int,
    nsfw: bool,
    chat: bool,
    bridge_agent: str,
    now: datetime,
) -> Worker:
    """Authenticate a pop's key, find or create the worker it names, and record what the
    worker declares now; return the worker with its account (the key's) loaded.

    One statement: the key's account is looked up; a new name creates the worker; a name of
    this account's updates what the worker declares and its last pop; a name owned by another
    account is refused, as is the anonymous account (it may not own workers). The last pop
    is written only when it is older than `capacity.check_in_fresh_since` (a tenth of the
    online window), as the AI Horde debounces its check-in, unless something the worker
    declares changed: then it is written at once. Most pops thus write nothing: a worker
    row update touches five indexes, the GIN index of its models among them.
    """
    found = fetch_instances(
        _CHECK_IN_SQL,
        {
            "api_key_hash": hash_api_key(required_api_key(api_key)),
            "name": name,
            "served_models": served_models,
            "max_length": max_length,
            "max_context_length": max_context_length,
            "threads": threads,
            "nsfw": nsfw,
            "chat": chat,
            "bridge_agent": bridge_agent,
            "now": now,
            "fresh_since": check_in_fresh_since(now),
        },
        (Account, None),
        (Worker, None),
    )
    if found is None:
        raise errors.InvalidAPIKey()
    account, worker = found
    if account.is_anonymous:
        raise errors.AnonForbiddenWorker()
    # No worker: another account created the name in the same instant.
    if worker is None or worker.account_id != account.id:
        raise errors.WrongCredentials("This worker name is owned by another account.")
    worker.account = account
    return worker


_DECLARED = ("served_models", "max_length", "max_context_length", "threads", "nsfw", "chat", "bridge_agent")
_DECLARED_NOW = (
    "%(served_models)s::varchar[], %(max_length)s::integer, %(max_context_length)s::integer, "
    "%(threads)s::smallint, %(nsfw)s::boolean, %(chat)s::boolean, %(bridge_agent)s::varchar"
)
# `caller` is the key's account (no row: an unknown key, so no row at all); `current` the
# worker row as it stands; `written` the upsert, tried unless the caller is anonymous or the
# row is the caller's, its last pop fresh and its declarations unchanged. An upsert on
# another account's name writes nothing (its WHERE), and the row returned is then that
# account's. Authenticating here saves the pop a round trip of its own.
_CHECK_IN_SQL = f"""
    WITH caller AS (
        SELECT {columns(Account)} FROM {Account._meta.db_table} WHERE api_key_hash = %(api_key_hash)s
    ),
    current AS (
        SELECT {columns(Worker)} FROM {Worker._meta.db_table} WHERE name = %(name)s
    ),
    written AS (
        INSERT INTO {Worker._meta.db_table} (
            id, name, account_id, {", ".join(_DECLARED)}, created_at, last_pop_at, speed, speed_samples,
            completed_jobs, aborted_jobs, aborts_window_start, uncompleted_jobs, maintenance,
            maintenance_reason)
        SELECT gen_random_uuid(), %(name)s, caller.id, {_DECLARED_NOW}, %(now)s, %(now)s,
               NULL, '{{}}', 0, 0, NULL, 0, false, ''
        FROM caller
        WHERE caller.api_key_hash <> '{ANONYMOUS_API_KEY_HASH}' AND NOT EXISTS (
            SELECT FROM current AS c
            WHERE c.account_id = caller.id
              AND c.last_pop_at > %(fresh_since)s AND c.last_pop_at <= %(now)s
              AND ({", ".join(f"c.{field}" for field in _DECLARED)}) IS NOT DISTINCT FROM ({_DECLARED_NOW})
        )
        ON CONFLICT (name) DO UPDATE SET
            {", ".join(f"{field} = EXCLUDED.{field}" for field in _DECLARED)},
            last_pop_at = EXCLUDED.last_pop_at
        WHERE {Worker._meta.db_table}.account_id = EXCLUDED.account_id
        RETURNING {columns(Worker)}
    ),
    worker AS (
        SELECT * FROM written
        UNION ALL
        SELECT * FROM current WHERE NOT EXISTS (SELECT FROM written)
    )
    SELECT {columns(Account, "caller")}, {columns(Worker, "worker")} FROM caller LEFT JOIN worker ON true
"""


def set_trust(*, accounts, trusted: bool) -> int:
    """Trust or untrust accounts; their workers' next pops get the matching lease cap."""
    return accounts.exclude(trusted=trusted).update(trusted=trusted)


def set_maintenance(*, workers, maintenance: bool, reason: str = "") -> int:
    """Put workers into maintenance (they then serve only their owner) or take them out."""
    if maintenance:
        return workers.update(maintenance=True, maintenance_reason=reason or "Set by a moderator.")
    # Leaving maintenance starts the abort window afresh, as the AI Horde's reset does.
    return workers.update(maintenance=False, maintenance_reason="", aborted_jobs=0)
