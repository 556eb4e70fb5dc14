"""The horde status of a request, as `GET /api/v2/generate/text/status/{id}` answers it."""

import bisect
import math
from datetime import datetime
from typing import Any

from django.conf import settings
from django.core.cache import cache
from django.db import connection
from django.db.models import Avg, Sum

from jobs import eligibility, sql
from jobs.models import Generation, TextRequest
from workers.models import Worker


def eligible_workers(request: TextRequest, *, now: datetime) -> dict[str, Any]:
    """Online workers the pop would offer this request to now: count, threads, and more.

    `capable` counts those of tier 1: when it is 0 but `workers` is not, only over-capacity
    workers could take the request (the status route's `might_stall`).
    """
    statement = sql.eligible_workers(names_models=bool(request.requested_models))
    with connection.cursor() as cursor:
        cursor.execute(statement, {**eligibility.params(now), "request": request.pk})
        workers, threads, capable, speed = cursor.fetchone()
    return {"workers": workers, "threads": threads, "capable": capable, "speed": speed}


# queue_position: the place of every POSITION_MARKER_EVERY-th waiting request, read in one walk
# of the queue at most every POSITION_MARKERS_SECONDS (cached in Redis for every process), and
# an exact count from the last of those before the request. Exact while the queue is shorter
# than one step; beyond, off by what the queue did since the markers were read, as the AI
# Horde's own position is computed from a list it refreshes.
POSITION_MARKER_EVERY = 1000
POSITION_MARKERS_SECONDS = 2
POSITION_MARKERS_KEY = "hordeops:queue-position-markers"


def _position_markers() -> list[tuple]:
    markers = cache.get(POSITION_MARKERS_KEY)
    if markers is None:
        with connection.cursor() as cursor:
            cursor.execute(sql.queue_markers(), {"every": POSITION_MARKER_EVERY})
            markers = cursor.fetchall()
        cache.set(POSITION_MARKERS_KEY, markers, POSITION_MARKERS_SECONDS)
    return markers


def queue_position_of(request: TextRequest) -> int:
    """The request's place in the queue, 1 for the next to be served (see the markers above);
    its cost is a count of at most about POSITION_MARKER_EVERY index entries."""
    markers = _position_markers()
    passed = bisect.bisect_left(markers, (request.fair_rank, -request.priority, request.created_at))
    after = markers[passed - 1] if passed else (None, None, None)
    with connection.cursor() as cursor:
        cursor.execute(
            sql.queued_between(),
            {
                "request": request.pk,
                "after_rank": after[0],
                "after_priority": after[1],
                "after_created": after[2],
            },
        )
        (between,) = cursor.fetchone()
    return passed * POSITION_MARKER_EVERY + between + 1


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


def generation_details(generation: Generation) -> dict[str, Any]:
    """A done generation as the status route lists it (and a webhook posts it: `jobs.webhooks`),
    its worker loaded."""
    return {
        "text": generation.text,
        "seed": generation.seed or 0,
        "gen_metadata": generation.gen_metadata,
        "worker_id": generation.worker_id,
        "worker_name": generation.worker.name,
        "model": generation.model,
        "state": generation.result or "ok",
    }


def request_status(request: TextRequest, *, now: datetime) -> dict[str, Any]:
    processing = request.generations.processing().count()
    done_generations = list(
        request.generations.filter(state=Generation.State.DONE)
        .select_related("worker")
        .order_by("finished_at")
    )
    eligible = eligible_workers(request, now=now)
    workers = eligible["workers"]
    threads = eligible["threads"]
    queue_position = 0
    wait_time = 0
    if request.state == TextRequest.State.ACTIVE and request.queued:
        queue_position = queue_position_of(request)  # the AI Horde's: first is 1, 0 is not queued
        wait_time = _wait_time(request, ahead=queue_position - 1, eligible=eligible, now=now)
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
        "generations": [generation_details(g) for g in done_generations],
        "eligible_workers": workers,
        "eligible_worker_threads": threads,
        # Only over-capacity workers could take it: it may wait, or be aborted at a cap.
        "might_stall": bool(workers) and not eligible["capable"],
    }
