"""Do the moderators' lists stay fast with a big horde? Every changelist, timed at 100,000 rows.

Run:  .venv/bin/python bench/admin_lists.py [--generations 100000] [--workers 10000] [--renders 5]

(about a minute; the JSON goes to stdout.)

It uses a database of its own, hordeops_bench_admin (created and migrated if missing), and
Redis database 12. It empties the tables, fills them with `bench.fill` (1,000 accounts,
--workers workers, --generations finished requests with one generation each, 2% of them
still processing, and 1,000 queued requests), then renders each admin page as a moderator
would see it, through Django's full request handling (middleware, session, permissions,
templates), with Django's test client in this process: once to warm up, then --renders
times. For each page it prints the median and the slowest render and the SQL queries it ran.
The target (issue 6): every changelist under one second.
"""

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.common import bench_env, setup_django  # noqa: E402

DATABASE = "hordeops_bench_admin"
os.environ.update(bench_env(DATABASE, 12))

PAGES = (
    "/admin/",
    "/admin/operations/",
    "/admin/workers/account/",
    "/admin/workers/account/?trusted__exact=1",
    "/admin/workers/account/?q=account-77",
    "/admin/workers/worker/",
    "/admin/workers/worker/?maintenance__exact=1",
    "/admin/workers/worker/?o=3",
    "/admin/workers/worker/?q=worker-4242",
    "/admin/jobs/textrequest/",
    "/admin/jobs/textrequest/?kind__exact=chat&state__exact=active",
    "/admin/jobs/textrequest/?p=500",
    "/admin/jobs/generation/",
    "/admin/jobs/generation/?lease=live",
    "/admin/jobs/generation/?lease=lapsed",
    "/admin/jobs/generation/?lease=aborted",
    "/admin/jobs/generation/?capacity=over",
    "/admin/jobs/generation/?capacity=limited",
    "/admin/jobs/generation/?state__exact=done&trusted_at_pop__exact=1",
    "/admin/jobs/generation/?o=6",
    "/admin/jobs/generation/?p=900",
)


def _fill(*, workers: int, generations: int) -> dict[str, int]:
    from django.db import connection

    from bench.fill import fill
    from jobs.models import Generation, TextRequest
    from workers.models import Account, Worker

    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE jobs_generation, jobs_textrequest, workers_worker CASCADE")
    Account.objects.exclude(name="Anonymous").delete()
    fill(accounts=1000, workers=workers, generations=generations, queued=1000)
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE jobs_generation, jobs_textrequest, workers_worker, workers_account")
    return {
        "accounts": Account.objects.count(),
        "workers": Worker.objects.count(),
        "requests": TextRequest.objects.count(),
        "generations": Generation.objects.count(),
        "processing_generations": Generation.objects.processing().count(),
    }


def _moderator_client():
    from django.contrib.auth.models import Group, Permission, User
    from django.test import Client

    from workers.moderation import grant_moderators

    user, _ = User.objects.get_or_create(username="bench-moderator", defaults={"is_staff": True})
    user.groups.add(grant_moderators(Group, Permission))
    from django.conf import settings

    # Outside a test run, the test client's "testserver" is a host this horde does not serve.
    client = Client(HTTP_HOST=settings.ALLOWED_HOSTS[0])
    client.force_login(user)
    return client


def _render(client, page: str, renders: int) -> dict:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    assert client.get(page).status_code == 200, page  # warm-up (template and query caches)
    seconds = []
    for _ in range(renders):
        with CaptureQueriesContext(connection) as queries:
            started = time.perf_counter()
            answer = client.get(page)
            seconds.append(time.perf_counter() - started)
        assert answer.status_code == 200, (page, answer.status_code)
    return {
        "median_ms": round(statistics.median(seconds) * 1000, 1),
        "max_ms": round(max(seconds) * 1000, 1),
        "queries": len(queries),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--generations", type=int, default=100_000)
    parser.add_argument("--workers", type=int, default=10_000)
    parser.add_argument("--renders", type=int, default=5)
    args = parser.parse_args()

    setup_django(DATABASE)
    started = time.perf_counter()
    rows = _fill(workers=args.workers, generations=args.generations)
    fill_seconds = round(time.perf_counter() - started, 1)
    client = _moderator_client()
    pages = {page: _render(client, page, args.renders) for page in PAGES}
    slowest = max(p["max_ms"] for p in pages.values())
    print(
        json.dumps(
            {
                "machine": {
                    "cores": os.cpu_count(),
                    "python": platform.python_version(),
                    "load_average_1m": round(os.getloadavg()[0], 2),
                },
                "rows": rows,
                "fill_seconds": fill_seconds,
                "renders_per_page": args.renders,
                "pages": pages,
                "slowest_render_ms": slowest,
                "target_met": slowest < 1000,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
