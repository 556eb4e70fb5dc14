"""The horde's status and statistics routes, as the AI Horde answers them (`/status/models`,
`/status/performance`, `/stats/text/totals`, `/stats/text/models`), each read in a fixed
number of statements and cached for as long as the AI Horde caches it (2 s for the models
and the load, 50 s for the statistics): a client polling them costs the database once per
period, whatever the number of clients.

hordeops has no model reference: every model a worker serves or a request names is "known".
"""

from datetime import datetime, timedelta
from typing import Any

from django.core.cache import cache
from django.db import connections

from hordeops import replica
from jobs import sql
from workers.details import TEXT
from workers.models import Worker

LIVE_SECONDS = 2  # the AI Horde's cache of /status/models and the load
STATS_SECONDS = 50  # and of /stats/text/*
NO_ETA = 10000  # the AI Horde's eta for a model nobody can serve now
MODELS_KEY, PERFORMANCE_KEY = "hordeops:discovery:models", "hordeops:discovery:performance"
TOTALS_KEY, MODEL_STATS_KEY = "hordeops:discovery:text-totals", "hordeops:discovery:text-models"
CACHE_KEYS = (MODELS_KEY, PERFORMANCE_KEY, TOTALS_KEY, MODEL_STATS_KEY)
PERIOD_LENGTHS = {
    "minute": timedelta(minutes=1),
    "hour": timedelta(hours=1),
    "day": timedelta(days=1),
    "month": timedelta(days=30),
}


def _cached(key: str, seconds: int, compute):
    found = cache.get(key)
    if found is None:
        found = compute()
        cache.set(key, found, seconds)
    return found


def _rows(statement: str, params: dict[str, Any]) -> list[tuple]:
    # On the replica where the route allows it (`hordeops.replica`): these answers are cached
    # for seconds already.
    with connections[replica.alias()].cursor() as cursor:
        cursor.execute(statement, params)
        return cursor.fetchall()


def _active_models(now: datetime) -> dict[str, dict[str, Any]]:
    """Every model online workers outside maintenance serve or a waiting request names."""
    served: dict[str, dict[str, Any]] = {}
    for models, threads, speed in (
        Worker.objects.online(now).filter(maintenance=False).values_list("served_models", "threads", "speed")
    ):
        for model in models:
            entry = served.setdefault(model, {"count": 0, "speeds": []})
            entry["count"] += threads
            if speed is not None:
                entry["speeds"].append(speed)
    queued = {model: (tokens, jobs) for model, tokens, jobs in _rows(sql.queued_per_model(), {"now": now})}
    active = {}
    for name in sorted(served.keys() | queued.keys()):
        count = served.get(name, {}).get("count", 0)
        speeds = served.get(name, {}).get("speeds", [])
        performance = round(sum(speeds) / len(speeds), 1) if speeds else 0.0
        tokens, jobs = queued.get(name, (0, 0))
        eta = int(tokens / (count * performance)) if count and performance else (0 if not tokens else NO_ETA)
        active[name] = {
            "name": name,
            "count": count,
            "performance": performance,
            "queued": float(tokens),
            "jobs": float(jobs),
            "eta": eta,
            "type": TEXT,
        }
    return active


def _models(now: datetime) -> dict[str, dict[str, Any]]:
    return _cached(MODELS_KEY, LIVE_SECONDS, lambda: _active_models(now))


def models_status(*, now: datetime, kind: str, min_count: int | None, max_count: int | None) -> list[dict]:
    """`GET /status/models`: the text models (none for `type=image`, the AI Horde's default)."""
    if kind != TEXT:
        return []
    active = _models(now)
    return [
        entry
        for entry in active.values()
        if (min_count is None or entry["count"] >= min_count)
        and (max_count is None or entry["count"] <= max_count)
    ]


def model_status(name: str, *, now: datetime) -> list[dict]:
    """`GET /status/models/{name}`: a list of one, or empty, as the AI Horde answers."""
    active = _models(now)
    return [active[name]] if name in active else []


def _performance(now: datetime) -> dict[str, Any]:
    online = Worker.objects.online(now).values_list("threads", flat=True)
    threads = list(online)
    [(queued_jobs, queued_tokens)] = _rows(sql.queued_totals(), {"now": now})
    [(minute_tokens,)] = _rows(sql.done_tokens_since(), {"since": now - PERIOD_LENGTHS["minute"]})
    return {
        "queued_requests": 0,
        "queued_text_requests": int(queued_jobs),
        "worker_count": 0,
        "text_worker_count": len(threads),
        "thread_count": 0,
        "text_thread_count": sum(threads),
        "queued_megapixelsteps": 0.0,
        "past_minute_megapixelsteps": 0.0,
        "queued_forms": 0.0,
        "interrogator_count": 0,
        "interrogator_thread_count": 0,
        "queued_tokens": float(queued_tokens),
        "past_minute_tokens": float(minute_tokens),
    }


def performance(*, now: datetime) -> dict[str, Any]:
    """`GET /status/performance`: the load, image and interrogation figures all 0."""
    return _cached(PERFORMANCE_KEY, LIVE_SECONDS, lambda: _performance(now))


def _text_totals(now: datetime) -> dict[str, dict[str, int]]:
    params = {period: now - length for period, length in PERIOD_LENGTHS.items()}
    [row] = _rows(sql.done_totals(), params)
    totals = {}
    for index, period in enumerate((*sql.PERIODS, "total")):
        requests, tokens = row[2 * index], row[2 * index + 1]
        totals[period] = {"requests": int(requests), "tokens": int(tokens)}
    return totals


def text_totals(*, now: datetime) -> dict[str, dict[str, int]]:
    """`GET /stats/text/totals`: requests and tokens generated per period."""
    return _cached(TOTALS_KEY, STATS_SECONDS, lambda: _text_totals(now))


def _text_models(now: datetime) -> dict[str, dict[str, int]]:
    params = {"day": now - PERIOD_LENGTHS["day"], "month": now - PERIOD_LENGTHS["month"]}
    stats: dict[str, dict[str, int]] = {"day": {}, "month": {}, "total": {}}
    for model, day, month, total in _rows(sql.done_per_model(), params):
        for period, count in (("day", day), ("month", month), ("total", total)):
            if count:
                stats[period][model] = count
    return stats


def text_models(*, now: datetime) -> dict[str, dict[str, int]]:
    """`GET /stats/text/models`: requests fulfilled per model, per period."""
    return _cached(MODEL_STATS_KEY, STATS_SECONDS, lambda: _text_models(now))
