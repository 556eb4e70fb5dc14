"""The horde status of a request, as `GET /api/v2/generate/text/status/{id}` answers it."""

import math
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import connection

from jobs import eligibility, sql
from jobs.models import Generation, TextRequest


def eligible_workers(request_id, *, now: datetime) -> dict[str, Any]:
    """Online workers the pop would offer this request to now: count, threads, and more.

    `capable` counts those of tier 1: when it is 0 but `workers` is not, only over-capacity
    workers could take the request (the status route's `might_stall`).
    """
    with connection.cursor() as cursor:
        cursor.execute(sql.eligible_workers(), {**eligibility.params(now), "request": request_id})
        workers, threads, capable, speed = cursor.fetchone()
    return {"workers": workers, "threads": threads, "capable": capable, "speed": speed}


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
        queue_position = TextRequest.objects.ahead_of(request).count()
        if threads:
            speed = eligible["speed"] or settings.UNMEASURED_TEXT_WORKER_TOKENS_PER_SECOND
            jobs_ahead = queue_position + request.queued
            wait_time = math.ceil(jobs_ahead * request.max_length / (speed * threads))
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
