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

With --requests-per-second R, requesters queue R text requests a second on the horde's route
(`/api/v2/generate/text/async`, 10 accounts, short replies) for the fleet's own models: a
worker that pops one submits it at once and pops again. Printed besides: the jobs served, the
time from a request's send to its worker's pop answer (p50, p99), the requests refused, and the
database's connections (fewest and most, read every 2 s).
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
REQUESTERS = 10
ENV = bench_env(
    DB_NAME, 14, KEY_RATE_PER_SECOND="0", ADDRESS_RATE_PER_SECOND="0", ACCOUNT_MAX_WAITING_REQUESTS="100000"
)
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
    requesters = [create_account(name=f"idle-requester-{index}")[1] for index in range(REQUESTERS)]
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE")
    connection.close()
    return api_key, requesters


def _connections() -> int:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = %s", [DB_NAME])
        return cursor.fetchone()[0] - 1  # not this one


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
            job = json.loads(answer).get("id") if status == 200 else None
            if job:
                # Sent at the time its prompt names, on this machine's clock.
                sent = float(json.loads(answer)["payload"]["prompt"].partition("=")[2])
                records[phase]["served"].append(time.time() - sent)
                submit = json.dumps({"id": job, "generation": "done"}).encode()
                status, _ = await http.post("/api/v2/generate/text/submit", submit)
                if status != 200:
                    records[phase]["failures"].append(f"submit {status}")
                continue  # a worker that served a job pops again at once
            records[phase]["latencies" if status == 200 else "failures"].append(
                time.monotonic() - started if status == 200 else status
            )
        except Exception as error:  # noqa: BLE001  (counted, the run goes on)
            records[phase]["failures"].append(type(error).__name__)
            await http.close()
        await asyncio.sleep(max(0.0, poll - (time.monotonic() - started)))
    await http.close()


async def _requests(port: int, keys: list[str], rate: float, stops: list, records: list) -> None:
    """`rate` text requests a second for the fleet's models until the last stop, spread over
    connections enough that none waits for the one before."""
    bodies: asyncio.Queue = asyncio.Queue()
    sending = [
        asyncio.create_task(
            _requester(KeepAliveConnection("127.0.0.1", port, {"apikey": key}), bodies, records)
        )
        for key in keys * 2
    ]
    index = 0
    start = time.monotonic()
    while time.monotonic() < stops[-1]:
        phase = 0 if time.monotonic() < stops[0] else 1
        body = {"prompt": f"t={time.time()}", "models": [f"idle-model-{index % 20}"],
                "params": {"max_length": 16, "max_context_length": 1024}}  # fmt: skip
        bodies.put_nowait((phase, json.dumps(body).encode()))
        index += 1
        await asyncio.sleep(max(0.0, start + index / rate - time.monotonic()))
    for _ in sending:
        bodies.put_nowait(None)
    await asyncio.gather(*sending)


async def _requester(http: KeepAliveConnection, bodies: asyncio.Queue, records: list) -> None:
    while (item := await bodies.get()) is not None:
        phase, body = item
        try:
            status, _ = await http.post("/api/v2/generate/text/async", body)
        except Exception as error:  # noqa: BLE001  (counted, the run goes on)
            status = type(error).__name__
            await http.close()
        if status != 202:
            records[phase]["refused"].append(status)
    await http.close()


async def _count_connections(stops: list, counts: list[int]) -> None:
    await asyncio.sleep(max(0.0, stops[0] - time.monotonic()))
    while time.monotonic() < stops[-1]:
        counts.append(await asyncio.to_thread(_connections))
        await asyncio.sleep(2)


async def _run(port: int, api_key: str, args, web_pid: int, requesters: list[str]) -> dict:
    """Warm up for 10 s, then measure for --seconds: the pops' latencies and the CPU used."""
    warm_until = time.monotonic() + 10 + args.workers / 100  # starting the clients takes a while
    stops = [warm_until, warm_until + args.seconds]
    records = [{"latencies": [], "failures": [], "served": [], "refused": []} for _ in range(2)]
    polls = [
        asyncio.create_task(_worker(port, api_key, i, args.poll_seconds, stops, records, args.wait_seconds))
        for i in range(args.workers)
    ]
    connections: list[int] = []
    if args.requests_per_second:
        polls.append(
            asyncio.create_task(_requests(port, requesters, args.requests_per_second, stops, records))
        )
        polls.append(asyncio.create_task(_count_connections(stops, connections)))
    await asyncio.sleep(max(0.0, warm_until - time.monotonic()))
    clock = CpuClock(web=children(web_pid), pg=await asyncio.to_thread(_backends))
    own_cpu = time.process_time()
    await asyncio.sleep(max(0.0, stops[1] - time.monotonic()))
    elapsed = clock.elapsed()
    spent = clock.spent(pg=await asyncio.to_thread(_backends))
    own_cpu = time.process_time() - own_cpu
    await asyncio.gather(*polls)
    return {**records[1], "elapsed": elapsed, **spent, "own": own_cpu, "connections": connections}


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
    parser.add_argument("--requests-per-second", type=float, default=0, help="text requests for the fleet")
    args = parser.parse_args()

    api_key, requesters = _prepare(args.queued)
    port = free_port()
    with serving(port, args.web_workers, ENV) as web:
        run = asyncio.run(_run(port, api_key, args, web.pid, requesters))
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
                **(_served(run, args) if args.requests_per_second else {}),
            },
            indent=2,
        )
    )


def _served(run: dict, args) -> dict:
    served = [s * 1000 for s in run["served"]]
    return {
        "requests_per_second": args.requests_per_second,
        "jobs_served": len(served),
        "queued_to_popped_p50_ms": round(percentile(served, 0.50), 1) if served else None,
        "queued_to_popped_p99_ms": round(percentile(served, 0.99), 1) if served else None,
        "requests_refused": len(run["refused"]),
        "refused_kinds": sorted({str(r) for r in run["refused"]}),
        "postgresql_connections": [min(run["connections"]), max(run["connections"])],
    }


if __name__ == "__main__":
    main()
