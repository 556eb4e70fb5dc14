"""The pop (check-in, claim, why nothing was offered) and the queueing of a request."""

from functools import cache

from hordeops.rows import columns, insert_columns
from jobs import eligibility
from jobs.models import QUEUE_SHAPE, TextRequest
from jobs.sql.names import (
    ACCOUNTS,
    ACTIVE,
    GENERATIONS,
    PROCESSING,
    QUEUED_MODELS,
    REQUESTS,
    TEXT,
    WORKERS,
    folded,
)
from kudos.sql import WALLETS, available, hold, post_event
from workers.capacity import ONLINE_SQL

# -- The pop ---------------------------------------------------------------------------------


# The popping worker as values (`pop_params`), as rows `w` and `wa` of the statements below.
_POPPING_WORKER = """
             (SELECT %(w_id)s::uuid AS id, %(w_account_id)s::bigint AS account_id,
                     %(w_speed)s::double precision AS speed, %(w_max_length)s::integer AS max_length,
                     %(w_max_context_length)s::integer AS max_context_length,
                     %(w_served_models)s::varchar[] AS served_models,
                     %(w_maintenance)s::boolean AS maintenance, %(w_chat)s::boolean AS chat,
                     %(w_tools)s::boolean AS tools,
                     %(w_structured_outputs)s::boolean AS structured_outputs,
                     %(w_bridge_agent)s::varchar AS bridge_agent) AS w,
             (SELECT %(wa_trusted)s::boolean AS trusted) AS wa"""

# How many waiting requests, from the head of the queue, a pop that found nothing explains.
SKIPPED_SCAN = 100


@cache
def skipped() -> str:
    """Why the first SKIPPED_SCAN waiting requests (in queue order, on `request_pop_queue`) were
    passed over by a pop that found nothing: (reason, count) per `eligibility.SKIP_REASONS`.
    Chat jobs are not counted for a worker that does not serve chat, nor jobs that need a
    capability it does not declare: they do not exist for it."""
    return f"""
        SELECT s.reason, count(*) FROM (
            SELECT {eligibility.skip_reason_sql("r", "w", "wa")} AS reason
            FROM {REQUESTS} AS r,{_POPPING_WORKER}
            WHERE r.state = '{ACTIVE}' AND r.queued > 0 AND r.expires_at > %(now)s
              AND (r.kind = '{TEXT}' OR w.chat) AND {eligibility.capable_sql("r", "w")}
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


# The jobs a pop takes of the request it claims: as many as it asks for and the request has
# queued, but one of a request that disables batching.
_TAKE = "LEAST(CASE WHEN p.disable_batching THEN 1 ELSE %(amount)s END, p.queued)"

# What the claim returns after the request's own columns, in order.
CLAIMED = ("fallback_tier", "take", "generation_model", "generation_ids")


@cache
def claim() -> str:
    """Lock the best request (`pop`), take up to `amount` of its jobs (`_TAKE`), insert their
    generations; return the request with `CLAIMED`.

    The model is the first the worker serves that the request asks for (or the worker's
    first, for a request that names none). Columns the INSERT leaves out take their
    database defaults (the models' `db_default`, or NULL).
    """
    # Whitespace folded: the statement psycopg parses and PostgreSQL receives is a third shorter
    # (its parsing is cached: hordeops.db.base.STATEMENT_CACHE_BYTES).
    return folded(f"""
        WITH picked AS ({pop()}),
        taken AS (
            UPDATE {REQUESTS} AS t
            SET queued = t.queued - {_TAKE}
            FROM picked AS p WHERE t.id = p.id
            RETURNING t.id, {_TAKE} AS take
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


# -- Queueing a request ------------------------------------------------------------------------

# A request's priority: its account's balance when it was queued, as a whole number.
_PRIORITY = "LEAST(GREATEST(round(a.balance), -2147483648), 2147483647)::integer"


@cache
def queue_request() -> str:
    """Insert the request (`insert_values` of it, but its fair rank and priority) at its fair
    rank, the account's waiting or running requests (counted to %(limit)s, on
    `request_active_by_account`), if they are fewer than %(limit)s and, where %(upfront)s, the
    account can spend %(upfront_cost)s (`kudos.sql.available`: its balance less %(floor)s less
    its holds). Its priority is the account's balance. Its cost is held (`kudos.sql.hold`) and
    the horde tax posted (`kudos.sql.post_event`) with it. Returns the rank (NULL where
    refused), the account's count and what it could spend (NULL where not %(upfront)s).

    Run after `kudos.sql.LOCK_ACCOUNT` in the same transaction: a statement of its own, so that
    its snapshot, taken once the lock is held, sees every request the account queued before and
    every spend it made.
    """
    names, values = insert_columns(TextRequest, exclude=("fair_rank", "priority"))
    return folded(f"""
        WITH admission AS (
            SELECT a.active, COALESCE(w.balance, 0) AS balance,
                   CASE WHEN %(upfront)s THEN {available("COALESCE(w.balance, 0)")} END
                       AS available
            FROM (
                SELECT count(*) AS active FROM (
                    SELECT 1 FROM {REQUESTS} AS r
                    WHERE r.account_id = %(account_id)s AND r.state = '{ACTIVE}' LIMIT %(limit)s
                ) AS r
            ) AS a
            LEFT JOIN {WALLETS} AS w ON w.account_id = %(account_id)s AND NOT w.escrow
        ),
        queued AS (
            INSERT INTO {REQUESTS} ({names}, fair_rank, priority)
            SELECT {values}, a.active, {_PRIORITY} FROM admission AS a
            WHERE a.active < %(limit)s AND (NOT %(upfront)s OR a.available >= %(upfront_cost)s)
            RETURNING id, account_id, kudos_reserved, fair_rank
        ),
        {hold(rows="SELECT id AS request_id, account_id, kudos_reserved AS amount FROM queued")},
        {post_event(guard="EXISTS (SELECT FROM queued)")}
        SELECT (SELECT fair_rank FROM queued), a.active, a.available FROM admission AS a
    """)


def _prefer(worker: str, returning: str) -> str:
    busy = f"SELECT count(*) FROM {GENERATIONS} AS g WHERE g.worker_id = w.id AND g.state = '{PROCESSING}'"
    return folded(f"""
        UPDATE {REQUESTS} AS r SET preferred_worker = w.id, preferred_until = %(until)s
        FROM {WORKERS} AS w JOIN {ACCOUNTS} AS wa ON wa.id = w.account_id
        WHERE r.id = %(request)s AND {worker} AND r.state = '{ACTIVE}' AND r.queued > 0
          AND {ONLINE_SQL.format(w="w")} AND ({busy}) < w.threads
          AND {eligibility.offer_sql("r", "w", "wa")}
        RETURNING {returning}
    """)


@cache
def prefer_worker() -> str:
    """Offer request %(request)s to worker %(worker)s alone until %(until)s (`jobs.affinity`),
    if the worker is online, has a thread free and would be offered the request now
    (`eligibility.offer_sql`, the speed gate included); returns the request's id if so."""
    return _prefer("w.id = %(worker)s", "r.id")


@cache
def prefer_model_worker() -> str:
    """Offer request %(request)s alone until %(until)s to one worker of model %(model)s that
    `prefer_worker` would take (the first of a `/v1` request's fallback models); returns that
    worker's id, if there is one."""
    return _prefer("w.served_models @> ARRAY[%(model)s]::varchar[]", "w.id")
