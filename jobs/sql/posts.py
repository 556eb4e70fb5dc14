"""The worker routes' statements after the pop: who posts, a renewal, a result."""

from functools import cache

from hordeops.rows import columns
from jobs.models import Generation, TextRequest
from jobs.sql.names import (
    ACCOUNTS,
    ACTIVE,
    DONE,
    GENERATIONS,
    PROCESSING,
    REQUEST_DONE,
    REQUESTS,
    TEXT,
    WORKERS,
    folded,
)
from kudos.sql import draw_holds, post_event, release_holds
from workers.models import Account, Worker

# -- Who posts: the worker routes' first read --------------------------------------------------

# The caller's account, the generation, its worker and its request, each with the fields the
# posts read (None: all of them); the rest load on access.
WORKER_POST_PARTS = (
    (Account, ("id", "api_key_hash", "trusted", "suspended_at", "suspension_reason")),
    (Generation, None),
    (Worker, ("account", "chat", "bridge_agent")),
    (
        TextRequest,
        (
            "kind",
            "state",
            "max_length",
            "max_context_length",
            "deadline_at",
            "followed",
            "stream",  # its first output commits the stream at the post (`record_progress`)
            "account",
            "prompt_tokens",
            # Whether the submit judges the reply (`jobs.protocols.agents`): only then are the
            # request's params read, a statement more.
            "needs_tools",
            "needs_structured_outputs",
            "webhook",  # an accepted submit queues its delivery (`jobs.webhooks`)
        ),
    ),
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
    """The lease a granted renewal moved (`%s` job_ttl, `%s` relayed bytes, `%s` id), written
    where the stale pass reads it (raw: the ORM's compiling of this update cost more than
    running it)."""
    return (
        f"UPDATE {GENERATIONS} SET job_ttl = %s, renewals = renewals + 1,"
        " relayed_bytes = GREATEST(relayed_bytes, %s)"
        f" WHERE id = %s AND state = '{PROCESSING}'"
    )


@cache
def relayed() -> str:
    """The output a post relayed without a renewal (`%s` relayed bytes, `%s` id)."""
    return (
        f"UPDATE {GENERATIONS} SET relayed_bytes = GREATEST(relayed_bytes, %s)"
        f" WHERE id = %s AND state = '{PROCESSING}'"
    )


@cache
def commit_stream() -> str:
    """A stream's commitment in one round trip (`%(generation)s`, `%(request)s`): the generation
    row locked first, in the order the stale pass and the submit lock (generation, then
    request), re-checked as running once a concurrent abort releases it; the request, still
    active, keeps its first committed generation; only then is the generation marked streamed.
    Its model, or no row when nothing was committed."""
    return folded(
        f"""
        WITH running AS (
            SELECT id, model FROM {GENERATIONS}
            WHERE id = %(generation)s AND request_id = %(request)s AND state = '{PROCESSING}'
            FOR UPDATE
        ), chosen AS (
            UPDATE {REQUESTS} SET stream_generation = COALESCE(stream_generation, %(generation)s)
            WHERE id = %(request)s AND state = '{ACTIVE}' AND EXISTS (SELECT 1 FROM running)
            RETURNING id
        )
        UPDATE {GENERATIONS} AS g SET streamed = true FROM running
        WHERE g.id = running.id AND EXISTS (SELECT 1 FROM chosen)
        RETURNING running.model
        """
    )


# A submitted generation's request, still active (its hold drawn down by the charge) or ended
# by it or before (its hold released).
_STILL_ACTIVE = f"SELECT id AS request_id, %(cost)s::numeric AS charged FROM counted WHERE state = '{ACTIVE}'"
_ENDED = f"SELECT id AS request_id FROM counted WHERE state <> '{ACTIVE}'"


# What the request's follow-up would begin with (`jobs.affinity.continued`): its prompt, the
# result and, for a chat, the end of the turn; its length and keyed digest, read where the
# prompt is, so that the submit reads no prompt.
_CONVERSATION = f"t.prompt || %(text)s || CASE WHEN t.kind = '{TEXT}' THEN '' ELSE %(turn_end)s END"
_TURN = (
    f"length({_CONVERSATION}) AS turn_length,"
    f" encode(sha256(%(turn_key)s::bytea || convert_to({_CONVERSATION}, 'UTF8')), 'hex') AS turn_digest"
)


@cache
def accept() -> str:
    """A submit's result, in one statement: the compare-and-set on the generation (whichever of
    the submit and the stale pass gets the row first wins; the other sees state != processing
    and changes nothing), the request's count and cost, the worker's speed and the largest context
    it has served (`Worker.served_context`), the kudos event that settles the generation
    (`kudos.sql.post_event`, posted only if accepted), and the request's hold: drawn down by
    the charge while it is active, released once it is not. Returns 1 if accepted, and the
    length and digest that the request's follow-up is known by (`_TURN`)."""
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
            kudos_spent = t.kudos_spent + %(cost)s,
            state = CASE WHEN t.state = '{ACTIVE}' AND t.finished >= t.n - 1 AND t.queued = 0
                         THEN '{REQUEST_DONE}' ELSE t.state END
        FROM accepted AS a WHERE t.id = a.request_id
        RETURNING t.id, t.state, {_TURN}
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
            kudos_rewards = w.kudos_rewards + %(reward)s,
            served_context = greatest(w.served_context, %(context)s)
        FROM accepted AS a WHERE w.id = a.worker_id
        RETURNING w.id
    ),
    {draw_holds(rows=_STILL_ACTIVE)},
    {release_holds(rows=_ENDED)},
    {post_event(guard="EXISTS (SELECT FROM accepted)")}
    -- Data-modifying WITH statements always run to completion, read or not.
    SELECT count(*), (SELECT turn_length FROM counted), (SELECT turn_digest FROM counted) FROM accepted
"""
