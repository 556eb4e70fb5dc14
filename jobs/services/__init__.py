"""The text flow's services: each owns its transaction and takes `now` from `hordeops.clock`
unless given. One module per thing the flow does:

- `requests`: queue a text or chat request (the account's bound, the fair rank), commit a stream
- `pop`: check a worker in and claim a job, in one statement
- `progress`: relay a chat worker's output and renew its lease
- `submit`: accept a result once, or take a given-back job
- `stale`: the stale pass
- `endings`: cancellation, restarts, abort counting and the relay of endings
- `posts`: what progress and submit share (whose generation, why refused)
"""

from jobs.services.endings import (
    cancel_account_requests,
    cancel_deferred,
    cancel_request,
    cancel_requests,
    current_request,
    defer_cancellations,
)
from jobs.services.pop import EmptyPop, PoppedJob, pop_generation, pop_params
from jobs.services.progress import ProgressResult, record_progress
from jobs.services.requests import (
    commit_stream,
    create_reply_request,
    create_text_request,
    estimate_tokens,
    prompt_tokens,
    render_chat_prompt,
)
from jobs.services.stale import StalePassResult, abort_stale_generations
from jobs.services.submit import submit_generation

__all__ = [
    "EmptyPop",
    "PoppedJob",
    "ProgressResult",
    "StalePassResult",
    "abort_stale_generations",
    "cancel_deferred",
    "cancel_account_requests",
    "cancel_requests",
    "cancel_request",
    "current_request",
    "defer_cancellations",
    "commit_stream",
    "create_reply_request",
    "create_text_request",
    "estimate_tokens",
    "pop_generation",
    "pop_params",
    "prompt_tokens",
    "record_progress",
    "render_chat_prompt",
    "submit_generation",
]
