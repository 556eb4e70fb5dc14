"""Latency of the worker routes, pop, progress and submit, against a live ASGI server.

Run:  .venv/bin/python bench/studies/route_latency.py [--calls 200] [--queued 200] [--web-workers 1]

It uses its own database (hordeops_bench, created and migrated if missing) and Redis
database 13, starts uvicorn on a free loopback port, queues --queued requests, then times
--calls sequential pops (each takes a job) and --calls submits over one keep-alive
connection; then pops one chat job and times --calls progress posts on it (each with new
output, so each runs the lease script and writes the renewal). It prints one JSON object
of figures in milliseconds.
"""

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from bench.common import bench_env, free_port, percentile, prepare_database  # noqa: E402

DB_NAME = "hordeops_bench"
os.environ.update(bench_env(DB_NAME, 13))


def _figures(samples: list[float]) -> dict[str, float]:
    ms = [s * 1000 for s in samples]
    return {
        "calls": len(ms),
        "median_ms": round(statistics.median(ms), 2),
        "p99_ms": round(percentile(ms, 0.99), 2),
        "mean_ms": round(statistics.fmean(ms), 2),
        "calls_per_second_sequential": round(len(ms) / sum(samples), 1),
    }


def _progress_throughput(base, worker_key, chat, requester, create_chat_request, threads, calls) -> dict:
    """Posts per second with `threads` workers each streaming its own chat job at once."""
    import threading

    import httpx

    jobs = []
    with httpx.Client(base_url=base, headers={"apikey": worker_key}, timeout=30) as client:
        # Every job to the one measured chat worker: a new, unmeasured one would be held back
        # by the speed gate while a faster worker is online, and pop nothing.
        body = chat
        for _ in range(threads):
            create_chat_request(
                account=requester,
                address="",
                model="bench-model",
                messages=[{"role": "user", "content": "bench"}],
                max_length=4096,
                params={},
            )
            jobs.append(client.post("/api/v2/generate/text/pop", json=body).json()["id"])
    per_thread = max(1, calls // threads)
    failures = []
    start = threading.Barrier(threads + 1)

    def stream(job_id: str) -> None:
        with httpx.Client(base_url=base, headers={"apikey": worker_key}, timeout=30) as client:
            start.wait()
            for seq in range(1, per_thread + 1):
                answer = client.post(
                    "/api/v2/generate/text/progress", json={"id": job_id, "seq": seq, "delta": "word "}
                )
                if answer.status_code != 200:
                    failures.append((answer.status_code, answer.text[:200]))

    workers = [threading.Thread(target=stream, args=(job_id,)) for job_id in jobs]
    for worker in workers:
        worker.start()
    start.wait()
    started = time.perf_counter()
    for worker in workers:
        worker.join()
    elapsed = time.perf_counter() - started
    return {
        "client_threads": threads,
        "posts": per_thread * threads,
        "failures": len(failures),
        "failure_sample": failures[:3],
        "posts_per_second": round(per_thread * threads / elapsed, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--queued", type=int, default=200)
    parser.add_argument("--web-workers", type=int, default=1)
    parser.add_argument(
        "--concurrency", type=int, default=8, help="client threads for the progress throughput phase"
    )
    args = parser.parse_args()
    queued = max(args.queued, args.calls + 1)  # the warm-up pop takes one

    prepare_database(DB_NAME)
    import django

    django.setup()
    import httpx
    from django.utils import timezone

    from jobs.models import Generation, TextRequest
    from jobs.services import create_chat_request
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

    port = free_port()
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
            chat = {**pop_body, "chat": True, "max_length": 16384, "max_context_length": 32768}
            client.post("/api/v2/generate/text/pop", json=chat)  # the chat worker announces its model
            create_chat_request(
                account=requester,
                address="",
                model="bench-model",
                messages=[{"role": "user", "content": "bench"}],
                max_length=4096,
                params={},
            )
            chat_job = client.post("/api/v2/generate/text/pop", json=chat).json()["id"]
            assert chat_job, "the chat job should have been popped"
            posts = []
            for seq in range(1, args.calls + 1):
                started = time.perf_counter()
                answer = client.post(
                    "/api/v2/generate/text/progress",
                    json={"id": chat_job, "seq": seq, "delta": "word " * 4, "tokens": seq * 4},
                )
                posts.append(time.perf_counter() - started)
                answer.raise_for_status()
            throughput = _progress_throughput(
                base, worker_key, chat, requester, create_chat_request, args.concurrency, args.calls
            )
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
                "progress": _figures(posts),
                "progress_throughput": throughput,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
