"""Every statement the jobs app writes by hand, built from its models' tables and choices:
`queue` (the pop and queueing), `posts` (progress and submit), `endings` (cancellation,
restarts, the stale pass) and `reads` (the status, discovery), on `names`.

Raw where a benchmark showed it pays (`docs/benchmarks.md`): the pop, the two hot worker
posts and the stale pass, which are set-based or single round trips the ORM cannot write,
or whose compiling cost more than running them. The rules they apply have their own homes
and are composed in here: the offer rule and speed gate (`jobs.eligibility`), the lapse test
(`jobs.models.lease_end_sql`), the online test (`workers.capacity.ONLINE_SQL`). State values
come from the models' `TextChoices`, written in as literals (they are constants, and a
literal lets the planner match the partial indexes). Each statement is built once (`cache`).
"""

from jobs.sql.endings import (
    STALE_PASS_LOCK,
    abort_lapsed,
    cancel_generations,
    ending_generations,
    expire_requests,
    restart_requests,
)
from jobs.sql.names import (
    ABORTED,
    ACCOUNTS,
    ACTIVE,
    CANCELLED,
    DONE,
    EXPIRED,
    FAULTED,
    GENERATIONS,
    PROCESSING,
    QUEUED_MODELS,
    REQUEST_DONE,
    REQUESTS,
    TEXT,
    WORKERS,
    folded,
)
from jobs.sql.posts import WORKER_POST_PARTS, accept, commit_stream, relayed, renew, worker_post
from jobs.sql.queue import (
    CLAIMED,
    NEAR_ROWS,
    SKIPPED_SCAN,
    claim,
    pop,
    prefer_model_worker,
    prefer_worker,
    queue_request,
    skipped,
)
from jobs.sql.reads import (
    PERIODS,
    disagreeing_holds,
    done_per_model,
    done_tokens_since,
    done_totals,
    eligible_workers,
    queue_markers,
    queued_between,
    queued_per_model,
    queued_totals,
    served_models,
)

__all__ = [
    "ABORTED",
    "ACCOUNTS",
    "ACTIVE",
    "CANCELLED",
    "CLAIMED",
    "DONE",
    "EXPIRED",
    "FAULTED",
    "GENERATIONS",
    "NEAR_ROWS",
    "PERIODS",
    "PROCESSING",
    "QUEUED_MODELS",
    "REQUESTS",
    "REQUEST_DONE",
    "SKIPPED_SCAN",
    "STALE_PASS_LOCK",
    "TEXT",
    "WORKERS",
    "WORKER_POST_PARTS",
    "abort_lapsed",
    "accept",
    "cancel_generations",
    "claim",
    "commit_stream",
    "disagreeing_holds",
    "done_per_model",
    "done_tokens_since",
    "done_totals",
    "eligible_workers",
    "ending_generations",
    "expire_requests",
    "folded",
    "pop",
    "prefer_model_worker",
    "prefer_worker",
    "queue_markers",
    "queue_request",
    "queued_between",
    "queued_per_model",
    "queued_totals",
    "relayed",
    "renew",
    "restart_requests",
    "served_models",
    "skipped",
    "worker_post",
]
