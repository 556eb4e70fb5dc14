"""Every statement the jobs app writes by hand, built from its models' tables and choices.

Raw where a benchmark showed it pays (`docs/benchmarks.md`): the pop, the two hot worker
posts and the stale pass, which are set-based or single round trips the ORM cannot write,
or whose compiling cost more than running them. The rules they apply have their own homes
and are composed in here: the offer rule and speed gate (`jobs.eligibility`), the lapse test
(`jobs.models.lease_end_sql`), the online test (`workers.capacity.ONLINE_SQL`). State values
come from the models' `TextChoices`, written in as literals (they are constants, and a
literal lets the planner match the partial indexes). Each statement is built once (`cache`).
"""

from functools import cache

from hordeops.rows import columns, insert_columns
from jobs import eligibility
from jobs.models import QUEUE_SHAPE, Ending, Generation, QueuedModel, TextRequest, lease_end_sql
from workers.capacity import ONLINE_SQL
from workers.models import Account, Worker

REQUESTS, GENERATIONS = TextRequest._meta.db_table, Generation._meta.db_table
QUEUED_MODELS = QueuedModel._meta.db_table
WORKERS, ACCOUNTS = Worker._meta.db_table, Account._meta.db_table

# Request states and generation states, as the statements write them.
ACTIVE, REQUEST_DONE = TextRequest.State.ACTIVE.value, TextRequest.State.DONE.value
TEXT = TextRequest.Kind.TEXT.value
EXPIRED, FAULTED = TextRequest.State.EXPIRED.value, TextRequest.State.FAULTED.value
PROCESSING, DONE = Generation.State.PROCESSING.value, Generation.State.DONE.value
ABORTED, CANCELLED = Generation.State.ABORTED.value, Generation.State.CANCELLED.value


# -- The pop ---------------------------------------------------------------------------------


# The popping worker as values (`pop_params`), as rows `w` and `wa` of the statements below.
_POPPING_WORKER = """
             (SELECT %(w_id)s::uuid AS id, %(w_account_id)s::bigint AS account_id,
                     %(w_speed)s::double precision AS speed, %(w_max_length)s::integer AS max_length,
                     %(w_max_context_length)s::integer AS max_context_length,
                     %(w_served_models)s::varchar[] AS served_models,
                     %(w_maintenance)s::boolean AS maintenance, %(w_chat)s::boolean AS chat) AS w,
             (SELECT %(wa_trusted)s::boolean AS trusted) AS wa"""

# How many waiting requests, from the head of the queue, a pop that found nothing explains.
SKIPPED_SCAN = 100


@cache
def skipped() -> str:
    """Why the first SKIPPED_SCAN waiting requests (in queue order, on `request_pop_queue`) were
    passed over by a pop that found nothing: (reason, count) per `eligibility.SKIP_REASONS`.
    Chat jobs are not counted for a worker that does not serve chat: they do not exist for it."""
    return f"""
        SELECT s.reason, count(*) FROM (
            SELECT {eligibility.skip_reason_sql("r", "w", "wa")} AS reason
            FROM {REQUESTS} AS r,{_POPPING_WORKER}
            WHERE r.state = '{ACTIVE}' AND r.queued > 0 AND r.expires_at > %(now)s
              AND (r.kind = '{TEXT}' OR w.chat)
            ORDER BY r.fair_rank ASC, r.priority DESC, r.created_at ASC
            LIMIT {SKIPPED_SCAN}
        ) AS s GROUP BY s.reason
    """


# How many of a model's rows, from the head of its queue, a pop reads one by one before it
# walks the model's shapes instead. Where it finds an offer among them (the common case)
# the shapes cost nothing; where the head is all requests it may not take, the shapes keep
# its cost flat however long the queue.
NEAR_ROWS = 16

_QUEUE_ORDER = "q.fair_rank ASC, q.priority DESC, q.created_at ASC"
_SHAPE = ", ".join(f"q.{column}" for column in QUEUE_SHAPE)


def _walk(rows: str, where: str, order: str = _QUEUE_ORDER) -> str:
    """The first request of `rows` (jobs_queuedmodel rows `q`, in queue order) that the
    popping worker may be offered, locked; with its tier for it."""
    return f"""
            SELECT r.*, {eligibility.tier_sql("r", "w", "wa")} AS fallback_tier
            FROM {rows} AS q JOIN {REQUESTS} AS r ON r.id = q.request_id
            WHERE {where} AND r.state = '{ACTIVE}' AND r.queued > 0
              AND ((r.expires_at > %(now)s AND {eligibility.offer_sql("r", "w", "wa")})
                   OR %(plan_hint)s::boolean)
            ORDER BY {order}
            LIMIT 1
            FOR UPDATE OF r SKIP LOCKED"""


@cache
def pop() -> str:
    """The best request this worker may be offered now, locked; with its tier for it.

    Queue order is fair across accounts, then priority, then age (`fair_rank`: an account's
    waiting or running requests when the request was queued). The walk reaches only requests
    that name one of the worker's models, or none: for each of its models, and for '', the
    rows of `jobs_queuedmodel` under that model, on its indexes, to the first request it may
    be offered, locked with SKIP LOCKED (so that concurrent pops pass each other's rows
    instead of waiting or taking one twice); the best of those few is the one. A request that
    names several of the worker's models is met once per model, and is the same row. The rows
    the others locked are freed with the statement's transaction.

    Per model, two walks. `near`: the first NEAR_ROWS rows in queue order (`queued_model_order`),
    each decided by the offer rule. `far`, only where `near` found nothing: the model's shapes
    (`jobs.models.QUEUE_SHAPE`), read by a skip scan of `queued_model_shape` (one index probe
    per shape, a recursive CTE), the rule decided once per shape (`eligibility.shape_offer_sql`),
    and each shape it may be offered walked in queue order to its first offer; the best of
    those. So requests the worker may not take (too long for it, gated to a faster worker, for
    trusted workers) cost one probe per shape, not one check each.

    `OR %(plan_hint)s` (always false) is a hint for the generic plan, which does not know
    the worker's values: it would guess that almost no request passes the offer rule, and
    then read every row of the model and sort them rather than walk the index to the first
    offer. A condition that may be true makes it guess that many pass, and walk the index.
    With the value known, as in a custom plan, the hint folds away.
    """
    # `fair_rank >= 0`: always true, the predicate of `queued_model_order` (jobs.models).
    near = f"""(SELECT * FROM {QUEUED_MODELS} AS q WHERE q.model = m.model AND q.fair_rank >= 0
                    ORDER BY {_QUEUE_ORDER} LIMIT {NEAR_ROWS})"""
    same_shape = " AND ".join(f"q.{column} = s.{column}" for column in QUEUE_SHAPE)
    shape_order = f"{_SHAPE}, {_QUEUE_ORDER}"  # the index's order (the shape's are all equal)
    return f"""
        SELECT c.* FROM{_POPPING_WORKER},
        unnest(%(w_served_models)s::varchar[] || ARRAY['']::varchar[]) AS m(model)
        LEFT JOIN LATERAL ({_walk(near, "true")}
        ) AS near ON true
        LEFT JOIN LATERAL (
            WITH RECURSIVE shapes AS (
                (SELECT {_SHAPE} FROM {QUEUED_MODELS} AS q
                 WHERE q.model = m.model AND near.id IS NULL ORDER BY {_SHAPE} LIMIT 1)
                UNION ALL
                SELECT n.* FROM shapes AS p, LATERAL (
                    SELECT {_SHAPE} FROM {QUEUED_MODELS} AS q
                    WHERE q.model = m.model AND ({_SHAPE}) > ({", ".join(f"p.{c}" for c in QUEUE_SHAPE)})
                    ORDER BY {_SHAPE} LIMIT 1
                ) AS n
            )
            SELECT f.* FROM (
                SELECT shapes.*, CASE WHEN m.model = '' THEN ARRAY[]::varchar[]
                                      ELSE ARRAY[m.model]::varchar[] END AS requested_models
                FROM shapes
            ) AS s,
            LATERAL ({_walk(QUEUED_MODELS, "q.model = m.model AND " + same_shape, shape_order)}
            ) AS f
            WHERE s.targeted OR {eligibility.shape_offer_sql("s", "w", "wa")}
            ORDER BY f.fair_rank ASC, f.priority DESC, f.created_at ASC
            LIMIT 1
        ) AS far ON true,
        LATERAL (SELECT near.* WHERE near.id IS NOT NULL
                 UNION ALL SELECT far.* WHERE far.id IS NOT NULL) AS c
        ORDER BY c.fair_rank ASC, c.priority DESC, c.created_at ASC
        LIMIT 1
    """


# What the claim returns after the request's own columns, in order.
CLAIMED = ("fallback_tier", "take", "generation_model", "generation_ids")


@cache
def claim() -> str:
    """Lock the best request (`pop`), take up to `amount` of its jobs, insert their
    generations; return the request with `CLAIMED`.

    The model is the first the worker serves that the request asks for (or the worker's
    first, for a request that names none). Columns the INSERT leaves out take their
    database defaults (the models' `db_default`, or NULL).
    """
    # Whitespace folded: the statement psycopg parses and PostgreSQL receives is a third shorter
    # (its parsing is cached: hordeops.db.base.STATEMENT_CACHE_BYTES).
    return _folded(f"""
        WITH picked AS ({pop()}),
        taken AS (
            UPDATE {REQUESTS} AS t
            SET queued = t.queued - LEAST(%(amount)s, p.queued)
            FROM picked AS p WHERE t.id = p.id
            RETURNING t.id, LEAST(%(amount)s, p.queued) AS take
        ),
        chosen AS (
            SELECT COALESCE((
                SELECT m FROM unnest(%(w_served_models)s::varchar[]) WITH ORDINALITY AS s(m, i)
                WHERE cardinality(p.requested_models) = 0 OR m = ANY(p.requested_models)
                ORDER BY i LIMIT 1), '') AS model
            FROM picked AS p
        ),
        started AS (
            INSERT INTO {GENERATIONS} (
                id, request_id, worker_id, model, state, popped_at, job_ttl, cap_seconds,
                trusted_at_pop, capacity_at_pop, fallback_tier, capacity_limited)
            SELECT gen_random_uuid(), p.id, %(w_id)s, c.model, '{PROCESSING}', %(now)s, %(job_ttl)s,
                   %(cap_seconds)s, %(wa_trusted)s, %(capacity)s, p.fallback_tier, %(capacity_limited)s
            FROM picked AS p, taken AS t, chosen AS c, generate_series(1, t.take)
            RETURNING id
        )
        SELECT {columns(TextRequest, "p")}, p.fallback_tier, t.take, c.model,
               ARRAY(SELECT id FROM started)
        FROM picked AS p, taken AS t, chosen AS c
    """)


def _folded(sql: str) -> str:
    """The statement on one line (it holds no comments, and no literal with spaces in it)."""
    assert "--" not in sql
    return " ".join(sql.split())


# -- Queueing a request ------------------------------------------------------------------------

# The account's row, locked until the transaction ends: requests of one account queue one at a
# time, so two cannot both take its last place (nor the same rank).
LOCK_ACCOUNT = f"SELECT 1 FROM {ACCOUNTS} WHERE id = %(account_id)s FOR UPDATE"


@cache
def queue_request() -> str:
    """Insert the request (`insert_values` of it, but its fair rank) at its fair rank, the
    account's waiting or running requests (counted to %(limit)s, on `request_active_by_account`),
    if they are fewer than %(limit)s; return the rank, or nothing where the account is at its bound.

    Run after LOCK_ACCOUNT in the same transaction: a statement of its own, so that its
    snapshot, taken once the lock is held, sees every request the account queued before.
    """
    names, values = insert_columns(TextRequest, exclude=("fair_rank",))
    return _folded(f"""
        INSERT INTO {REQUESTS} ({names}, fair_rank)
        SELECT {values}, a.active FROM (
            SELECT count(*) AS active FROM (
                SELECT 1 FROM {REQUESTS} AS r
                WHERE r.account_id = %(account_id)s AND r.state = '{ACTIVE}' LIMIT %(limit)s
            ) AS r
        ) AS a
        WHERE a.active < %(limit)s
        RETURNING fair_rank
    """)


# -- Who posts: the worker routes' first read --------------------------------------------------

# The caller's account, the generation, its worker and its request, each with the fields the
# posts read (None: all of them); the rest load on access.
WORKER_POST_PARTS = (
    (Account, ("id",)),
    (Generation, None),
    (Worker, ("account", "chat")),
    (TextRequest, ("kind", "state", "max_length", "deadline_at")),
)


@cache
def worker_post() -> str:
    """The caller's row is the one row, the generation joined to it: an unknown key gives no
    row whether or not the generation exists, as authenticating first would."""
    (_, caller_fields), _, (_, worker_fields), (_, request_fields) = WORKER_POST_PARTS
    return (
        f"SELECT {columns(Account, 'a', caller_fields)}, {columns(Generation, 'g')}, "
        f"{columns(Worker, 'w', worker_fields)}, {columns(TextRequest, 'r', request_fields)} "
        f"FROM {ACCOUNTS} AS a "
        f"LEFT JOIN ({GENERATIONS} AS g "
        f"JOIN {WORKERS} AS w ON w.id = g.worker_id "
        f"JOIN {REQUESTS} AS r ON r.id = g.request_id) ON g.id = %(id)s "
        "WHERE a.api_key_hash = %(api_key_hash)s"
    )


# -- Progress and submit -------------------------------------------------------------------


@cache
def renew() -> str:
    """The lease a granted renewal moved (`%s` job_ttl, `%s` id), written where the stale pass
    reads it (raw: the ORM's compiling of this update cost more than running it)."""
    return (
        f"UPDATE {GENERATIONS} SET job_ttl = %s, renewals = renewals + 1"
        f" WHERE id = %s AND state = '{PROCESSING}'"
    )


@cache
def accept() -> str:
    """A submit's result, in one statement: the compare-and-set on the generation (whichever of
    the submit and the stale pass gets the row first wins; the other sees state != processing
    and changes nothing), the request's count and the worker's speed. Returns 1 if accepted."""
    return f"""
    WITH accepted AS (
        UPDATE {GENERATIONS} SET
            state = '{DONE}', finished_at = %(now)s, text = %(text)s, result = %(result)s,
            seed = %(seed)s, gen_metadata = %(gen_metadata)s::jsonb, tokens = %(tokens)s,
            reward = %(reward)s
        WHERE id = %(id)s AND state = '{PROCESSING}'
        RETURNING request_id, worker_id
    ),
    counted AS (
        UPDATE {REQUESTS} AS t SET
            finished = t.finished + 1,
            state = CASE WHEN t.state = '{ACTIVE}' AND t.finished >= t.n - 1 AND t.queued = 0
                         THEN '{REQUEST_DONE}' ELSE t.state END
        FROM accepted AS a WHERE t.id = a.request_id
        RETURNING t.id
    ),
    -- The speed is computed from the row itself, so concurrent submits by one worker both land.
    measured AS (
        UPDATE {WORKERS} AS w SET
            speed_samples = (w.speed_samples || %(sample)s::float8)
                [greatest(1, cardinality(w.speed_samples) + 2 - %(window)s):],
            speed = (SELECT avg(x) FROM unnest(
                (w.speed_samples || %(sample)s::float8)
                    [greatest(1, cardinality(w.speed_samples) + 2 - %(window)s):]) AS x),
            completed_jobs = w.completed_jobs + 1,
            tokens_generated = w.tokens_generated + %(tokens)s,
            kudos_rewards = w.kudos_rewards + %(reward)s
        FROM accepted AS a WHERE w.id = a.worker_id
        RETURNING w.id
    )
    -- Data-modifying WITH statements always run to completion, read or not.
    SELECT count(*) FROM accepted
"""


# -- Endings: cancellation and restarts --------------------------------------------------------


@cache
def cancel_generations() -> str:
    """Cancel processing generations (`ids`), each with its settlement information."""
    return f"""
        UPDATE {GENERATIONS} AS g
        SET state = '{CANCELLED}', finished_at = %(now)s, settlement_information = v.settlement
        FROM (SELECT unnest(%(ids)s::uuid[]) AS id, unnest(%(settlement)s::jsonb[]) AS settlement) AS v
        WHERE g.id = v.id AND g.state = '{PROCESSING}'
        """


@cache
def restart_requests() -> str:
    """Give `added` aborted jobs back to each request (`ids`), or fault it: past `max`
    restarts, or at once, ending `after_commit`, if its stream was committed.
    Returns (id, state, kind, ending)."""
    fault = f"r.state = '{ACTIVE}' AND (r.stream_generation IS NOT NULL OR r.restarts + v.added >= %(max)s)"
    return f"""
        UPDATE {REQUESTS} AS r SET
          restarts = r.restarts + v.added,
          queued = CASE WHEN r.state = '{ACTIVE}' AND NOT ({fault}) THEN r.queued + v.added ELSE 0 END,
          state = CASE WHEN {fault} THEN '{FAULTED}' ELSE r.state END,
          ending = CASE WHEN NOT ({fault}) THEN r.ending
                        WHEN r.stream_generation IS NOT NULL THEN %(after_commit)s
                        ELSE '{Ending.RESTARTS.value}' END
        FROM (SELECT unnest(%(ids)s::uuid[]) AS id, unnest(%(added)s::int[]) AS added) AS v
        WHERE r.id = v.id
        RETURNING r.id, r.state, r.kind, r.ending
        """


# -- The stale pass ----------------------------------------------------------------------------

# One stale pass at a time across every Celery worker (a transaction-scoped advisory lock).
STALE_PASS_LOCK = "SELECT pg_try_advisory_xact_lock(%s)"

# Why a request past its `expires_at` ended: its deadline, or its lifetime.
_EXPIRY_REASON = (
    "CASE WHEN r.deadline_at IS NOT NULL AND r.deadline_at <= r.expires_at"
    f" THEN '{Ending.DEADLINE.value}' ELSE '{Ending.LIFETIME.value}' END"
)


# `one`: the statement for one request (`request_id`), as the status and a cancellation make
# it final the moment it passes its lifetime or deadline; else for every request (the pass).
def _which(one: bool) -> str:
    return " AND r.id = %(request_id)s" if one else ""


@cache
def ending_generations(one: bool = False) -> str:
    """Running generations of requests past their lifetime or deadline, locked, with why and
    the request's max_length."""
    return f"""
        SELECT g.id, {_EXPIRY_REASON}, r.max_length FROM {GENERATIONS} AS g
        JOIN {REQUESTS} AS r ON g.request_id = r.id
        WHERE g.state = '{PROCESSING}' AND r.state = '{ACTIVE}' AND r.expires_at <= %(now)s{_which(one)}
        FOR UPDATE OF g
        """


@cache
def expire_requests(one: bool = False) -> str:
    """Expire the requests past their lifetime or deadline; returns (id, kind, why)."""
    return f"""
        UPDATE {REQUESTS} AS r SET state = '{EXPIRED}', queued = 0, ending = {_EXPIRY_REASON}
        WHERE r.state = '{ACTIVE}' AND r.expires_at <= %(now)s{_which(one)}
        RETURNING r.id, r.kind, {_EXPIRY_REASON}
        """


@cache
def abort_lapsed() -> str:
    """Abort every processing generation whose lease ended before `now`.

    The lapse test must sit in this UPDATE's own WHERE: a renewal committed while the pass
    waits on the row lock is then re-checked against the renewed job_ttl. A subquery would
    not be re-checked. Returns (id, request id, worker id, trusted at pop).
    """
    return f"""
        UPDATE {GENERATIONS} SET state = '{ABORTED}', finished_at = %(now)s
        WHERE state = '{PROCESSING}'
          AND {lease_end_sql()} < %(now)s
        RETURNING id, request_id, worker_id, trusted_at_pop
        """


# -- The status -------------------------------------------------------------------------------


@cache
def eligible_workers(*, names_models: bool) -> str:
    """Online workers the pop would offer request `request` to now: count, threads, tier 1s
    and their mean speed (`jobs.eligibility.params` and `request`).

    For a request that names models, the workers that serve one of them are found on the GIN
    index `worker_models_gin` (the overlap, which the offer rule checks too, written where the
    planner can use the index), so that the cost follows them, not the whole fleet."""
    serving = " AND w.served_models && r.requested_models" if names_models else ""
    return (
        f"SELECT count(*), coalesce(sum(w.threads), 0),"
        f" count(*) FILTER (WHERE {eligibility.tier_sql('r', 'w', 'wa')} = 1), avg(w.speed)"
        f" FROM {REQUESTS} AS r,"
        f" {WORKERS} AS w JOIN {ACCOUNTS} AS wa ON wa.id = w.account_id"
        f" WHERE r.id = %(request)s{serving} AND {ONLINE_SQL.format(w='w')} AND {eligibility.offer_sql()}"
    )


# A waiting request's place in the queue, with every key ascending as `request_queue_position`
# indexes it, so that a row comparison on it is one index range.
_QUEUE_PLACE = "(r.fair_rank, (r.priority * -1), r.created_at)"
_QUEUED = f"r.state = '{ACTIVE}' AND r.queued > 0"


@cache
def queue_markers() -> str:
    """The place of every `every`-th waiting request, in queue order: one walk of the index."""
    return f"""
        SELECT s.fair_rank, s.negated_priority, s.created_at FROM (
            SELECT r.fair_rank, (r.priority * -1) AS negated_priority, r.created_at,
                   row_number() OVER (ORDER BY {_QUEUE_PLACE}) AS n
            FROM {REQUESTS} AS r WHERE {_QUEUED}
        ) AS s
        WHERE s.n %% %(every)s = 0
        ORDER BY s.n
        """


@cache
def queued_between() -> str:
    """Waiting requests after the place `after` (or from the head, when it is NULL) and before
    request `request`'s own place: an index range of `request_queue_position`."""
    return f"""
        SELECT count(*) FROM {REQUESTS} AS r, {REQUESTS} AS t
        WHERE t.id = %(request)s AND {_QUEUED}
          AND {_QUEUE_PLACE} < (t.fair_rank, (t.priority * -1), t.created_at)
          AND (%(after_rank)s::integer IS NULL
               OR {_QUEUE_PLACE} > (%(after_rank)s::integer, %(after_priority)s::integer,
                                    %(after_created)s::timestamptz))
        """


# -- The discovery routes (cached by their callers) ---------------------------------------------


@cache
def queued_per_model() -> str:
    """For each model a waiting request names: the tokens and the jobs it still waits for."""
    return f"""
        SELECT m.model, sum(r.max_length * r.queued), sum(r.queued)
        FROM {REQUESTS} AS r, unnest(r.requested_models) AS m(model)
        WHERE r.state = '{ACTIVE}' AND r.queued > 0 AND r.expires_at > %(now)s
        GROUP BY m.model
        """


@cache
def queued_totals() -> str:
    """Waiting requests' jobs and tokens, all models together."""
    return f"""
        SELECT coalesce(sum(r.queued), 0), coalesce(sum(r.max_length * r.queued), 0)
        FROM {REQUESTS} AS r
        WHERE r.state = '{ACTIVE}' AND r.queued > 0 AND r.expires_at > %(now)s
        """


# The periods of the AI Horde's text statistics, as parameters of the statements below.
PERIODS = ("minute", "hour", "day", "month")


@cache
def done_totals() -> str:
    """Accepted generations and their tokens in each period (`PERIODS`), and in all."""
    columns_ = ", ".join(
        f"count(*) FILTER (WHERE g.finished_at >= %({p})s), "
        f"coalesce(sum(g.tokens) FILTER (WHERE g.finished_at >= %({p})s), 0)"
        for p in PERIODS
    )
    return (
        f"SELECT {columns_}, count(*), coalesce(sum(g.tokens), 0)"
        f" FROM {GENERATIONS} AS g WHERE g.state = '{DONE}'"
    )


@cache
def done_per_model() -> str:
    """Accepted generations per model: in the past day, month and in all."""
    return (
        f"SELECT g.model, count(*) FILTER (WHERE g.finished_at >= %(day)s),"
        f" count(*) FILTER (WHERE g.finished_at >= %(month)s), count(*)"
        f" FROM {GENERATIONS} AS g WHERE g.state = '{DONE}' GROUP BY g.model"
    )


@cache
def done_tokens_since() -> str:
    """Tokens of the generations accepted since `since` (on the index `generation_done_finished`)."""
    return (
        f"SELECT coalesce(sum(g.tokens), 0) FROM {GENERATIONS} AS g"
        f" WHERE g.state = '{DONE}' AND g.finished_at >= %(since)s"
    )
