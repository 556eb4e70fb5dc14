"""How long a queued job waits for its worker: a waiting pop against a pop every second.

Run:  .venv/bin/python bench/pop_wait.py [--requests 30] [--workers 4] [--web-workers 2]

(about two minutes; the JSON goes to stdout.)

Its own database (hordeops_bench_popwait) and Redis database 10. The default stack's web app
(gunicorn with --web-workers uvicorn workers, as `bin/stack` runs it) serves --workers idle
workers, each popping in a loop and submitting a job the moment it gets one, and one
requester that queues --requests text requests on the horde's async route at random moments
(0.5 to 1.5 s apart). Measured, per mode: from the requester's 202 to the worker's pop
answer with the job (the latency a worker's polling adds to a request), and how many pops
the idle workers sent a second. Modes: `wait` (`wait_seconds` 20, the bridge's default) and
`poll` (no wait, a pop every second, the bridge's `--pop_interval` before it waited).
"""

import argparse
import asyncio
import json
import os
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.common import (  # noqa: E402
    bench_env,
    free_port,
    percentile,
    python_loop_seconds,
    reset_tables,
    serving,
    setup_django,
)

DB_NAME = "hordeops_bench_popwait"
ENV = bench_env(DB_NAME, 10, KEY_RATE_PER_SECOND="0", ADDRESS_RATE_PER_SECOND="0")
os.environ.update(ENV)
MODEL = "bench-wait-model"


def _prepare() -> tuple[str, str]:
    """Empty tables; the workers' and the requester's API keys."""
    setup_django(DB_NAME)
    from workers.services import create_account

    reset_tables()
    _, worker_key = create_account(name="bench-wait-owner", trusted=True)
    requester, requester_key = create_account(name="bench-wait-requester", trusted=True)
    requester.max_waiting_requests = 10**6
    requester.save(update_fields=["max_waiting_requests"])
    return worker_key, requester_key


async def _worker(client, name: str, key: str, wait: float, got: dict, stop: asyncio.Event, pops: list):
    body = {"name": name, "models": [MODEL], "max_length": 512, "max_context_length": 4096}
    if wait:
        body["wait_seconds"] = wait
    headers = {"apikey": key}
    while not stop.is_set():
        started = time.monotonic()
        answer = (await client.post("/api/v2/generate/text/pop", json=body, headers=headers)).json()
        pops.append(time.monotonic())
        if answer.get("id"):
            got[answer["payload"]["prompt"]] = time.monotonic()
            await client.post(
                "/api/v2/generate/text/submit",
                json={"id": answer["id"], "generation": "done"},
                headers=headers,
            )
            continue
        if not wait:  # a polling worker pops every second
            await asyncio.sleep(max(0.0, 1.0 - (time.monotonic() - started)))


async def _run(port: int, mode: str, worker_key: str, requester_key: str, args) -> dict:
    import httpx

    base = f"http://127.0.0.1:{port}"
    wait = 20.0 if mode == "wait" else 0.0
    got: dict[str, float] = {}
    queued: dict[str, float] = {}
    pops: list[float] = []
    stop = asyncio.Event()
    limits = httpx.Limits(max_connections=args.workers + 4)
    async with httpx.AsyncClient(base_url=base, timeout=60, limits=limits) as client:
        workers = [
            asyncio.create_task(_worker(client, f"{mode}-{i}", worker_key, wait, got, stop, pops))
            for i in range(args.workers)
        ]
        await asyncio.sleep(2)  # every worker checked in and idle
        idle_from, idle_pops = time.monotonic(), len(pops)
        rng = random.Random(7)
        for i in range(args.requests):
            await asyncio.sleep(rng.uniform(0.5, 1.5))
            prompt = f"{mode} request {i}"
            answer = await client.post(
                "/api/v2/generate/text/async",
                json={"prompt": prompt, "models": [MODEL], "params": {"max_length": 16}},
                headers={"apikey": requester_key},
            )
            assert answer.status_code == 202, answer.text
            queued[prompt] = time.monotonic()
        await asyncio.sleep(2)
        idle_seconds = time.monotonic() - idle_from
        pops_sent = len(pops) - idle_pops
        stop.set()
        await asyncio.sleep(0)
        for worker in workers:
            worker.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
    latencies = [(got[p] - queued[p]) * 1000 for p in queued if p in got]
    return {
        "served": f"{len(latencies)}/{len(queued)}",
        "job_reaches_worker_ms": {
            "p50": round(percentile(latencies, 0.5), 1),
            "p90": round(percentile(latencies, 0.9), 1),
            "max": round(max(latencies), 1),
        },
        "pops_per_second": round(pops_sent / idle_seconds, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=30)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--web-workers", type=int, default=2)
    parser.add_argument("--modes", default="wait,poll")
    args = parser.parse_args()
    worker_key, requester_key = _prepare()
    port = free_port()
    figures = {}
    with serving(port, args.web_workers, ENV):
        for mode in args.modes.split(","):
            figures[mode] = asyncio.run(_run(port, mode, worker_key, requester_key, args))
    print(
        json.dumps(
            {
                "bench": "pop_wait",
                "machine": {
                    "cores": os.cpu_count(),
                    "load_average_1m": round(os.getloadavg()[0], 2),
                    "python_loop_seconds": python_loop_seconds(),
                },
                "workers": args.workers,
                "requests": args.requests,
                "modes": figures,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
