"""Latency of the worker routes, pop and submit, against a live ASGI server.

Run:  .venv/bin/python bench/route_latency.py [--calls 200] [--queued 200] [--web-workers 1]

It uses its own database (hordeops_bench, created and migrated if missing) and Redis
database 13, starts uvicorn on a free loopback port, queues --queued requests, then times
--calls sequential pops (each takes a job) and --calls submits over one keep-alive
connection, and prints one JSON object of figures in milliseconds.
"""

import argparse
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
DB_NAME = "hordeops_bench"
os.environ["DATABASE_URL"] = f"postgres://postgres@127.0.0.1:5432/{DB_NAME}"
os.environ["REDIS_URL"] = "redis://127.0.0.1:6379/13"
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "hordeops.settings")
os.environ.setdefault("LOG_LEVEL", "WARNING")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _prepare_database() -> None:
    subprocess.run([str(ROOT / "bin" / "services"), DB_NAME], check=True)
    subprocess.run([sys.executable, "manage.py", "migrate", "--noinput", "-v0"], cwd=ROOT, check=True)


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _figures(samples: list[float]) -> dict[str, float]:
    ms = [s * 1000 for s in samples]
    return {
        "calls": len(ms),
        "median_ms": round(statistics.median(ms), 2),
        "p99_ms": round(_percentile(ms, 0.99), 2),
        "mean_ms": round(statistics.fmean(ms), 2),
        "calls_per_second_sequential": round(len(ms) / sum(samples), 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--queued", type=int, default=200)
    parser.add_argument("--web-workers", type=int, default=1)
    args = parser.parse_args()
    queued = max(args.queued, args.calls + 1)  # the warm-up pop takes one

    _prepare_database()
    import django

    django.setup()
    import httpx
    from django.utils import timezone

    from jobs.models import Generation, TextRequest
    from workers.models import Account, Worker
    from workers.services import create_account

    Generation.objects.all().delete()
    TextRequest.objects.all().delete()
    Worker.objects.all().delete()
    Account.objects.exclude(name="Anonymous").delete()
    requester, _ = create_account(name="bench-requester")
    owner, worker_key = create_account(name="bench-owner", trusted=True)
    now = timezone.now()
    TextRequest.objects.bulk_create(
        TextRequest(
            account=requester,
            prompt=f"bench prompt {i}",
            params={"max_length": 80, "max_context_length": 2048},
            requested_models=["bench-model"],
            created_at=now,
            expires_at=now + timezone.timedelta(hours=1),
        )
        for i in range(queued)
    )

    port = _free_port()
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "uvicorn",
            "hordeops.asgi:application",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            str(args.web_workers),
            "--no-access-log",
            "--log-level",
            "warning",
        ],
        cwd=ROOT,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        with httpx.Client(base_url=base, headers={"apikey": worker_key}, timeout=30) as client:
            for _ in range(100):
                try:
                    if client.get("/api/v2/status/heartbeat").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                time.sleep(0.1)
            pop_body = {"name": "bench-worker", "models": ["bench-model"], "max_length": 512}
            client.post("/api/v2/generate/text/pop", json={**pop_body, "name": "warmup"})
            pops, ids = [], []
            for _ in range(args.calls):
                started = time.perf_counter()
                answer = client.post("/api/v2/generate/text/pop", json=pop_body)
                pops.append(time.perf_counter() - started)
                answer.raise_for_status()
                ids.append(answer.json()["id"])
            assert all(ids), "every timed pop should take a job"
            submits = []
            for generation_id in ids:
                started = time.perf_counter()
                answer = client.post(
                    "/api/v2/generate/text/submit", json={"id": generation_id, "generation": "x" * 200}
                )
                submits.append(time.perf_counter() - started)
                answer.raise_for_status()
    finally:
        server.terminate()
        server.wait(timeout=30)

    print(
        json.dumps(
            {
                "bench": "route_latency",
                "machine": {"cores": os.cpu_count(), "python": platform.python_version()},
                "server": f"uvicorn hordeops.asgi:application --workers {args.web_workers}",
                "queued_requests": queued,
                "pop": _figures(pops),
                "submit": _figures(submits),
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
