"""The status and the discovery routes' reads, and the holds' check."""

from functools import cache

from jobs import eligibility
from jobs.sql.names import (
    ACCOUNTS,
    ACTIVE,
    DONE,
    GENERATIONS,
    REQUESTS,
    WORKERS,
    folded,
)
from kudos.sql import HOLDS
from workers.capacity import ONLINE_SQL
from workers.declaration import CAPABILITIES

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


@cache
def served_models(*, chat: bool, needs: tuple[str, ...]) -> str:
    """For each of `%(models)s` (in their order, one row each): its online workers (chat
    workers only for a chat), the longest reply one of them accepts and the longest that fits
    `%(prompt_size)s` tokens of prompt in its context, both among the workers that declare
    every capability in `needs`, and how many declare each of them. One statement for all
    the models, each found on the GIN index `worker_models_gin`."""
    assert set(needs) <= set(CAPABILITIES), needs  # column names, written in
    capable = " AND ".join(f"w.{name}" for name in needs) or "true"
    declaring = "".join(f", count(w.id) FILTER (WHERE w.{name})" for name in needs)
    return folded(
        f"""
        SELECT count(w.id), max(w.max_length) FILTER (WHERE {capable}),
               max(LEAST(w.max_length, w.max_context_length - %(prompt_size)s)) FILTER (WHERE {capable})
               {declaring}
        FROM unnest(%(models)s::text[]) WITH ORDINALITY AS m(model, position)
        LEFT JOIN {WORKERS} AS w ON w.served_models && ARRAY[m.model]::varchar(255)[]
            AND w.deleted_at IS NULL AND {ONLINE_SQL.format(w="w")}{" AND w.chat" if chat else ""}
        GROUP BY m.position ORDER BY m.position
        """
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


# -- The holds ----------------------------------------------------------------------------------


@cache
def disagreeing_holds() -> str:
    """The holds that disagree with their requests (`kudos.holds`): an active request's hold
    missing, not its account's or not its cost less what it was charged, or a hold with no
    active request. Returns (request id, request's account, what it should hold, hold's
    account, what it holds), NULL for the side that is missing; at most 20."""
    should = "GREATEST(r.kudos_reserved - r.kudos_spent, 0)"
    return f"""
        SELECT COALESCE(r.id, h.request_id), r.account_id, {should}, h.account_id, h.amount
        FROM (SELECT * FROM {REQUESTS} WHERE state = '{ACTIVE}') AS r
        FULL JOIN {HOLDS} AS h ON h.request_id = r.id
        WHERE r.id IS NULL OR h.request_id IS NULL
           OR h.account_id <> r.account_id OR h.amount <> {should}
        LIMIT 20
    """
