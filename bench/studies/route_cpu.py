"""CPU per request of pop, progress and submit: the web process's and PostgreSQL's, one at a time.

Run:  .venv/bin/python bench/studies/route_cpu.py [--calls 600] [--queued 10000]

(under a minute; the JSON goes to stdout.)

Throughput on a shared 2-core machine moves with whatever else runs; CPU time per request
does much less, so this is the figure to compare a change by. It uses the database of
bench/route_throughput.py (hordeops_bench_routes) and Redis database 10, queues --queued
requests with `bench/fill.py`, starts gunicorn with one uvicorn worker, and sends --calls
pops, then --calls progress posts on the chat jobs popped, then one submit per job, one
request at a time over a keep-alive connection. Around each phase it reads the CPU time
(user + system, from /proc) of the web worker and of every PostgreSQL process, and prints
both per request, with the wall time per request.
"""

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from bench.common import (  # noqa: E402
    HTTPConnection,
    children,
    cpu_seconds,
    free_port,
    postgres_pids,
    prepare_database,
    python_loop_seconds,
    start_web,
)
from bench.route_throughput import DB_NAME, _env, _fill_queue, pop_body  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=600)
    parser.add_argument("--queued", type=int, default=10_000)
    args = parser.parse_args()
    prepare_database(DB_NAME, _env())
    os.environ.update(_env())
    import django

    django.setup()
    api_key = _fill_queue(args.queued)
    from django.db import connection

    connection.close()
    port = free_port()
    server = start_web(port, 1, _env())
    try:
        http_ = HTTPConnection("127.0.0.1", port, timeout=30)
        worker_pid = children(server.pid)[0]
        headers = {"apikey": api_key, "Content-Type": "application/json"}
        pop_json = json.dumps(pop_body("cpu-w"))

        def post(path: str, body: str) -> dict:
            http_.request("POST", path, body, headers)
            answer = http_.getresponse()
            content = answer.read()
            assert answer.status == 200, (path, answer.status, content[:200])
            return json.loads(content)

        jobs: list[tuple[str, str]] = []
        for _ in range(20):  # warm-up: check-in, prepared statements, caches
            job = post("/api/v2/generate/text/pop", pop_json)
            jobs.append((job["id"], job["kind"]))

        def measure(calls: int, send) -> dict:
            postgres = postgres_pids()
            web0, pg0, wall0 = cpu_seconds([worker_pid]), cpu_seconds(postgres), time.perf_counter()
            for i in range(calls):
                send(i)
            wall = time.perf_counter() - wall0
            return {
                "calls": calls,
                "web_cpu_ms": round((cpu_seconds([worker_pid]) - web0) / calls * 1000, 2),
                "postgres_cpu_ms": round((cpu_seconds(postgres) - pg0) / calls * 1000, 2),
                "wall_ms": round(wall / calls * 1000, 2),
            }

        def pop(_: int) -> None:
            job = post("/api/v2/generate/text/pop", pop_json)
            jobs.append((job["id"], job["kind"]))

        figures = {"pop": measure(args.calls, pop)}
        chats = [job_id for job_id, kind in jobs if kind == "chat"]
        seqs = dict.fromkeys(chats, 0)

        def progress(i: int) -> None:
            job_id = chats[i % len(chats)]
            seqs[job_id] += 1
            post(
                "/api/v2/generate/text/progress",
                json.dumps(
                    {"id": job_id, "seq": seqs[job_id], "delta": "more words ", "tokens": seqs[job_id]}
                ),
            )

        figures["progress"] = measure(args.calls, progress)
        figures["submit"] = measure(
            len(jobs),
            lambda i: post(
                "/api/v2/generate/text/submit", json.dumps({"id": jobs[i][0], "generation": "The end."})
            ),
        )
    finally:
        server.terminate()
        server.wait(timeout=30)
    print(
        json.dumps(
            {
                "bench": "route_cpu",
                "machine": {
                    "cores": os.cpu_count(),
                    "load_average_1m": round(os.getloadavg()[0], 2),
                    "python_loop_seconds": python_loop_seconds(),
                },
                "server": "gunicorn -k hordeops.web_worker.QuietUvicornWorker -w 1, one request at a time",
                "queued_requests": args.queued,
                **figures,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
