"""The stale pass at scale: aborting 10,000 lapsed generations at once, and a pass over
100,000 live ones with nothing to abort.

Run:  .venv/bin/python bench/stale_pass.py [--lapsed 10000] [--live 100000] [--repeat 5]

(about a minute; the JSON goes to stdout.)

It uses its own database (hordeops_bench_stale, created and migrated if missing) and Redis
database 9. Each case empties the tables, then fills them in set-based SQL: 20 accounts,
2,000 workers, and one active request per generation with its generation processing, popped
an hour ago (lapsed: every lease long over) or just now (live: every lease running). It then
times `jobs.services.abort_stale_generations(now=...)`, the very function the Celery beat task
calls, with its commit and its after-commit work (counters, lease kills, relay events):

    lapsed   one pass over --lapsed lapsed generations (refilled and timed --repeat times);
             each pass must abort them all and restart their requests
    idle     --repeat passes over --live live generations, none of which may be aborted

Printed: per case the seconds per pass (median, slowest), what the pass reported, and the
queries it ran; and the machine's cores and load average.
"""

import argparse
import json
import os
import platform
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.common import bench_env, setup_django  # noqa: E402

DB_NAME = "hordeops_bench_stale"
os.environ.update(bench_env(DB_NAME, 9))


def _fill(count: int, *, popped_seconds_ago: int) -> None:
    """Empty the tables; `count` active requests, each with one processing generation."""
    from django.db import connection, transaction

    from bench.fill import fill
    from workers.models import Account

    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE jobs_generation, jobs_textrequest, workers_worker CASCADE")
    Account.objects.exclude(name="Anonymous").delete()
    fill(accounts=20, workers=2000)
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            """
            CREATE TEMP TABLE stale_rows AS
            SELECT i, gen_random_uuid() AS request_id, gen_random_uuid() AS generation_id
            FROM generate_series(1, %(n)s) AS i
            """,
            {"n": count},
        )
        cursor.execute(
            """
            INSERT INTO jobs_textrequest (
                id, account_id, kind, state, prompt, messages, params, max_length, max_context_length,
                requested_models, allowed_workers, trusted_workers, slow_workers, priority, n, queued,
                finished, restarts, created_at, expires_at, stream_generation, deadline_at)
            SELECT s.request_id, a.ids[1 + mod(s.i, cardinality(a.ids))], 'text', 'active', 'bench prompt',
                   NULL, '{}', 80, 2048, '{}', '{}', false, true, 0, 1, 0, 0, 0,
                   now() - interval '2 hours', now() + interval '1 day', NULL, NULL
            FROM stale_rows AS s, (SELECT array_agg(id) AS ids FROM workers_account) AS a
            """
        )
        cursor.execute(
            """
            INSERT INTO jobs_generation (
                id, request_id, worker_id, model, state, popped_at, job_ttl, cap_seconds,
                trusted_at_pop, renewals, capacity_at_pop, fallback_tier, capacity_limited,
                settlement_information, finished_at, text, result, seed, gen_metadata, tokens, reward)
            SELECT s.generation_id, s.request_id, w.ids[1 + mod(s.i, cardinality(w.ids))], 'model-0',
                   'processing', now() - %(ago)s * interval '1 second', 150, 600, mod(s.i, 2) = 0, 0,
                   1200, 1, false, NULL, NULL, NULL, '', NULL, '[]', NULL, 0
            FROM stale_rows AS s, (SELECT array_agg(id) AS ids FROM workers_worker) AS w
            """,
            {"ago": popped_seconds_ago},
        )
        cursor.execute("DROP TABLE stale_rows")
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE jobs_generation, jobs_textrequest, workers_worker")


def _timed_pass(now) -> tuple[float, dict, int]:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from jobs.services import abort_stale_generations

    with CaptureQueriesContext(connection) as queries:
        started = time.perf_counter()
        result = abort_stale_generations(now=now)
        seconds = time.perf_counter() - started
    return (
        seconds,
        {
            "ran": result.ran,
            "aborted": result.aborted,
            "expired_requests": result.expired_requests,
            "workers_into_maintenance": len(result.maintenance),
        },
        len(queries),
    )


def _figures(seconds: list[float]) -> dict:
    return {
        "median_s": round(statistics.median(seconds), 3),
        "slowest_s": round(max(seconds), 3),
        "passes": len(seconds),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lapsed", type=int, default=10_000)
    parser.add_argument("--live", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    setup_django(DB_NAME)
    from django.utils import timezone

    from jobs.models import Generation, TextRequest

    lapsed_seconds, lapsed_report, lapsed_queries = [], None, 0
    for _ in range(args.repeat):
        _fill(args.lapsed, popped_seconds_ago=3600)
        seconds, lapsed_report, lapsed_queries = _timed_pass(timezone.now())
        assert lapsed_report["aborted"] == args.lapsed, lapsed_report
        assert not Generation.objects.processing().exists()
        assert TextRequest.objects.queued().count() == args.lapsed  # every one restarted
        lapsed_seconds.append(seconds)

    _fill(args.live, popped_seconds_ago=0)
    idle_seconds, idle_report, idle_queries = [], None, 0
    for _ in range(args.repeat):
        seconds, idle_report, idle_queries = _timed_pass(timezone.now() + timedelta(seconds=1))
        assert idle_report["aborted"] == 0, idle_report
        idle_seconds.append(seconds)
    assert Generation.objects.processing().count() == args.live

    print(
        json.dumps(
            {
                "bench": "stale_pass",
                "machine": {
                    "cores": os.cpu_count(),
                    "python": platform.python_version(),
                    "load_average_1m": round(os.getloadavg()[0], 2),
                },
                "lapsed": {
                    "generations": args.lapsed,
                    **_figures(lapsed_seconds),
                    "report": lapsed_report,
                    "queries": lapsed_queries,
                },
                "idle": {
                    "live_generations": args.live,
                    **_figures(idle_seconds),
                    "report": idle_report,
                    "queries": idle_queries,
                },
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
