"""The horde status of a request, as `GET /api/v2/generate/text/status/{id}` answers it."""

import math
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import connection
from django.db.models import Avg, Sum

from jobs import eligibility, sql
from jobs.models import Generation, TextRequest
from workers.models import Worker


def eligible_workers(request_id, *, now: datetime) -> dict[str, Any]:
    """Online workers the pop would offer this request to now: count, threads, and more.

    `capable` counts those of tier 1: when it is 0 but `workers` is not, only over-capacity
    workers could take the request (the status route's `might_stall`).
    """
    with connection.cursor() as cursor:
        cursor.execute(sql.eligible_workers(), {**eligibility.params(now), "request": request_id})
        workers, threads, capable, speed = cursor.fetchone()
    return {"workers": workers, "threads": threads, "capable": capable, "speed": speed}


def _wait_time(request: TextRequest, *, ahead: int, eligible: dict[str, Any], now: datetime) -> int:
    """Seconds until the request's jobs are done, as the AI Horde estimates them: the tokens of
    the jobs ahead and its own, over the speed of the workers that may serve it, or of the whole
    online fleet when none may now (at least 1 token a second, as there)."""
    threads, speed = eligible["threads"], eligible["speed"]
    if not threads:
        fleet = Worker.objects.online(now).aggregate(threads=Sum("threads"), speed=Avg("speed"))
        threads, speed = fleet["threads"] or 0, fleet["speed"]
    rate = (speed or settings.UNMEASURED_TEXT_WORKER_TOKENS_PER_SECOND) * threads if threads else 1
    return math.ceil((ahead + request.queued) * request.max_length / rate)


def request_status(request: TextRequest, *, now: datetime) -> dict[str, Any]:
    processing = request.generations.processing().count()
    done_generations = list(
        request.generations.filter(state=Generation.State.DONE)
        .select_related("worker")
        .order_by("finished_at")
    )
    eligible = eligible_workers(request.pk, now=now)
    workers = eligible["workers"]
    threads = eligible["threads"]
    queue_position = 0
    wait_time = 0
    if request.state == TextRequest.State.ACTIVE and request.queued:
        ahead = TextRequest.objects.ahead_of(request).count()
        queue_position = ahead + 1  # the AI Horde's: first in the queue is 1, 0 is not queued
        wait_time = _wait_time(request, ahead=ahead, eligible=eligible, now=now)
    return {
        "finished": request.finished,
        "processing": processing,
        "restarted": request.restarts,
        "waiting": request.queued,
        "done": request.is_done,
        "faulted": request.state in (TextRequest.State.FAULTED, TextRequest.State.EXPIRED),
        "is_possible": bool(workers or processing),
        "wait_time": wait_time,
        "queue_position": queue_position,
        "kudos": round(sum(g.reward for g in done_generations), 2),
        "generations": [
            {
                "text": g.text,
                "seed": g.seed or 0,
                "gen_metadata": g.gen_metadata,
                "worker_id": g.worker_id,
                "worker_name": g.worker.name,
                "model": g.model,
                "state": g.result or "ok",
            }
            for g in done_generations
        ],
        "eligible_workers": workers,
        "eligible_worker_threads": threads,
        # Only over-capacity workers could take it: it may wait, or be aborted at a cap.
        "might_stall": bool(workers) and not eligible["capable"],
    }
