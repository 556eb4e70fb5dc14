"""1,000 idle workers polling every 2 s against 100,000 queued requests: what do their pops cost?

Run:  .venv/bin/python bench/idle_fleet.py [--workers 1000] [--queued 100000] [--seconds 60]
          [--poll-seconds 2] [--web-workers 2] [--wait-seconds 20]

(about two minutes; the JSON goes to stdout.)

Its own database (hordeops_bench_idle) and Redis database 14. The queue is filled as
`bench/flat_costs.py` fills it (chat requests over 20 models, a tenth for models no worker
serves, and a fleet of 100 workers that serves the 20, offline by the time the run starts).
Then the default stack's web app (gunicorn, --web-workers uvicorn workers, as `bin/stack`
runs it) takes the pops of --workers simulated chat workers, all in one asyncio loop, each
polling every --poll-seconds with a keep-alive connection and serving a model nobody asks
for: every pop finds nothing, as a public horde's idle workers' do (with --wait-seconds, each
pop waits that long at the horde and the next follows at once: the pop p50 is then the wait).
Printed: the pops sent and answered, their latency (p50, p99), the CPU seconds per second of
the web processes and of this database's PostgreSQL backends, and `python_loop_seconds` (the
VM's speed that day).
"""

import argparse
import asyncio
import json
import os
import random
import sys
import time
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.common import (  # noqa: E402
    CpuClock,
    KeepAliveConnection,
    bench_env,
    children,
    free_port,
    percentile,
    python_loop_seconds,
    serving,
    setup_django,
)

DB_NAME = "hordeops_bench_idle"
ENV = bench_env(DB_NAME, 14, KEY_RATE_PER_SECOND="0", ADDRESS_RATE_PER_SECOND="0")
os.environ.update(ENV)


def _prepare(queued: int) -> str:
    """Fill the queue; return the idle workers' API key."""
    setup_django(DB_NAME)
    from django.db import connection
    from django.utils import timezone
    from django_redis import get_redis_connection

    from bench.flat_costs import fill_queue
    from workers.models import Worker
    from workers.services import create_account

    fill_queue(queued, 100, timezone.now())
    # The fleet that serves the queue's models has gone: none of it is online now.
    Worker.objects.update(last_pop_at=timezone.now() - timedelta(hours=1))
    get_redis_connection("default").flushdb()
    _, api_key = create_account(name="idle-owner")
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE")
    connection.close()
    return api_key


def _backends() -> list[int]:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT pid FROM pg_stat_activity WHERE datname = %s", [DB_NAME])
        pids = [row[0] for row in cursor.fetchall()]
    return pids


async def _worker(
    port: int, api_key: str, index: int, poll: float, stops: list, records: list, wait: float = 0
) -> None:
    """One idle worker: its own keep-alive connection; pops every `poll` seconds until the
    last stop, recording into the phase it is in. With `wait`, each pop waits that long at the
    horde (`wait_seconds`) and the next follows at once."""
    declared = {"name": f"idle-{index}", "models": [f"idle-model-{index % 20}"], "chat": True,
                "max_length": 4096, "max_context_length": 8192}  # fmt: skip
    if wait:
        declared["wait_seconds"] = wait
    body = json.dumps(declared).encode()
    http = KeepAliveConnection("127.0.0.1", port, {"apikey": api_key})
    await asyncio.sleep(random.uniform(0, poll))  # spread over the poll interval
    while time.monotonic() < stops[-1]:
        phase = 0 if time.monotonic() < stops[0] else 1
        started = time.monotonic()
        try:
            status, answer = await asyncio.wait_for(http.post("/api/v2/generate/text/pop", body), 30 + wait)
            ok = status == 200 and json.loads(answer).get("id") is None
            records[phase]["latencies" if ok else "failures"].append(
                time.monotonic() - started if ok else status
            )
        except Exception as error:  # noqa: BLE001  (counted, the run goes on)
            records[phase]["failures"].append(type(error).__name__)
            await http.close()
        await asyncio.sleep(max(0.0, poll - (time.monotonic() - started)))
    await http.close()


async def _run(port: int, api_key: str, args, web_pid: int) -> dict:
    """Warm up for 10 s, then measure for --seconds: the pops' latencies and the CPU used."""
    warm_until = time.monotonic() + 10 + args.workers / 100  # starting the clients takes a while
    stops = [warm_until, warm_until + args.seconds]
    records = [{"latencies": [], "failures": []}, {"latencies": [], "failures": []}]
    polls = [
        asyncio.create_task(_worker(port, api_key, i, args.poll_seconds, stops, records, args.wait_seconds))
        for i in range(args.workers)
    ]
    await asyncio.sleep(max(0.0, warm_until - time.monotonic()))
    clock = CpuClock(web=children(web_pid), pg=await asyncio.to_thread(_backends))
    own_cpu = time.process_time()
    await asyncio.sleep(max(0.0, stops[1] - time.monotonic()))
    elapsed = clock.elapsed()
    spent = clock.spent(pg=await asyncio.to_thread(_backends))
    own_cpu = time.process_time() - own_cpu
    await asyncio.gather(*polls)
    return {**records[1], "elapsed": elapsed, **spent, "own": own_cpu}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=1000)
    parser.add_argument("--queued", type=int, default=100_000)
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--poll-seconds", type=float, default=2)
    parser.add_argument("--web-workers", type=int, default=2)
    parser.add_argument(
        "--wait-seconds", type=float, default=0, help="each pop waits this long for a job (the bridge's 20)"
    )
    args = parser.parse_args()

    api_key = _prepare(args.queued)
    port = free_port()
    with serving(port, args.web_workers, ENV) as web:
        run = asyncio.run(_run(port, api_key, args, web.pid))
    latencies, failures, elapsed = run["latencies"], run["failures"], run["elapsed"]
    web_cpu, pg_cpu, own_cpu = run["web"], run["pg"], run["own"]
    ms = [s * 1000 for s in latencies]
    print(
        json.dumps(
            {
                "bench": "idle_fleet",
                "python_loop_seconds": python_loop_seconds(),
                "cores": os.cpu_count(),
                "queued": args.queued,
                "workers": args.workers,
                "poll_seconds": args.poll_seconds,
                "wait_seconds": args.wait_seconds,
                "web_workers": args.web_workers,
                "seconds": round(elapsed, 1),
                "empty_pops": len(latencies),
                "pops_per_second": round(len(latencies) / elapsed, 1),
                "failures": len(failures),
                "failure_kinds": sorted({str(f) for f in failures}),
                "pop_p50_ms": round(percentile(ms, 0.50), 1) if ms else None,
                "pop_p99_ms": round(percentile(ms, 0.99), 1) if ms else None,
                "web_cores": round(web_cpu / elapsed, 2),
                "postgresql_cores": round(pg_cpu / elapsed, 3),
                "load_generator_cores": round(own_cpu / elapsed, 2),
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
