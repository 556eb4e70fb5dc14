"""Throughput and latency of pop, progress and submit, served as in production, under load.

Run:  .venv/bin/python bench/route_throughput.py [--queued 100,10000,100000] [--calls 3000]
          [--web-workers 5] [--clients 2] [--threads 16]

(a few minutes; the JSON goes to stdout, progress notes to stderr.)

It uses its own database (hordeops_bench_routes, created and migrated if missing) and Redis
database 10. For each queue size it empties the tables, fills the queue with `bench/fill.py`
(chat and text requests over 20 models; at 100 queued each request wants 20 generations, so
that the pops do not empty the queue), starts gunicorn with --web-workers uvicorn workers
(`-k hordeops.web_worker.QuietUvicornWorker`, as `bin/web` runs it) on a free loopback port,
and runs the load from --clients separate processes of --threads threads each, every thread
one keep-alive HTTP/1.1 connection and one worker name (a chat worker serving all 20
models). Three phases, each started together across the processes:

    pop       --calls pops in all, each taking a job (the queue holds more than that)
    progress  --calls progress posts on the chat jobs popped, each with new output (so each
              runs the lease script, relays and renews)
    submit    one submit per job popped

For each phase: calls, requests per second over the phase's wall time, p50/p99/max latency
in ms, and any non-200 answers. The target (issue 7): at least 300 requests per second per
route with 100,000 queued. The machine's cores and its load average are printed with them, and
`python_loop_seconds` (`python_loop_seconds()`): this VM's speed moves from day to day.
"""

import argparse
import http.client
import json
import multiprocessing
import os
import platform
import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.common import (  # noqa: E402
    HTTPConnection,
    bench_env,
    free_port,
    percentile,
    python_loop_seconds,
    reset_tables,
    serving,
    setup_django,
    web_server,
)

DB_NAME = "hordeops_bench_routes"
MODELS = [f"model-{i}" for i in range(20)]


def _env() -> dict[str, str]:
    return bench_env(DB_NAME, 10)


# --- the load processes -------------------------------------------------------------------


class Connection:
    """A keep-alive HTTP/1.1 connection, as light as the standard library allows, opened
    anew every `reconnect_every` requests, as a real worker's is after idle timeouts: a new
    connection goes to whichever web process is free to accept it, so that the load spreads
    over the processes as a fleet's many connections do."""

    def __init__(self, port: int, api_key: str, reconnect_every: int) -> None:
        self.http = HTTPConnection("127.0.0.1", port, timeout=60)
        self.headers = {"apikey": api_key, "Content-Type": "application/json"}
        self.reconnect_every = reconnect_every
        self.sent = 0

    def post(self, path: str, body: dict) -> tuple[int, bytes, float]:
        payload = json.dumps(body)
        self.sent += 1
        if self.reconnect_every and self.sent % self.reconnect_every == 0:
            self.http.close()  # reconnects on the next request, inside the timing
        for attempt in (1, 2):
            started = time.perf_counter()
            try:
                self.http.request("POST", path, payload, self.headers)
                answer = self.http.getresponse()
                content = answer.read()
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
                # The server closed the idle keep-alive connection (between phases) before
                # reading this request: reconnect and send it again, once.
                self.http.close()
                if attempt == 2:
                    raise
                continue
            return answer.status, content, time.perf_counter() - started
        raise AssertionError("unreachable")


def pop_body(name: str) -> dict:
    """The pop of a bench worker named `name`: a chat worker serving every bench model."""
    return {"name": name, "models": MODELS, "chat": True, "max_length": 4096, "max_context_length": 8192}


def _thread(
    port: int, api_key: str, name: str, calls: int, reconnect: int, phases: dict, barrier, out: dict
) -> None:
    connection = Connection(port, api_key, reconnect)
    body = pop_body(name)
    jobs: list[tuple[str, str]] = []
    # The first pop checks the worker in (and warms the connection); a job it takes is kept.
    status, content, _ = connection.post("/api/v2/generate/text/pop", body)
    if status == 200 and json.loads(content)["id"]:
        jobs.append((json.loads(content)["id"], json.loads(content).get("kind", "text")))
    result = {phase: {"latencies": [], "errors": [], "start": 0.0, "end": 0.0} for phase in phases}

    def timed(phase: str, path: str, bodies) -> None:
        record = result[phase]
        barrier.wait(timeout=600)
        record["start"] = time.time()
        for body in bodies:
            try:
                status, content, seconds = connection.post(path, body)
            except OSError as error:
                record["errors"].append((0, repr(error)))
                continue
            record["latencies"].append(seconds)
            if status != 200:
                record["errors"].append((status, content[:120].decode(errors="replace")))
            elif path.endswith("/pop"):
                answer = json.loads(content)
                if answer["id"]:
                    jobs.append((answer["id"], answer.get("kind", "text")))
        record["end"] = time.time()

    timed("pop", "/api/v2/generate/text/pop", (body for _ in range(calls)))
    chats = [job_id for job_id, kind in jobs if kind == "chat"]

    def progress_bodies():
        seq = dict.fromkeys(chats, 0)
        for i in range(calls):
            if not chats:
                return
            job_id = chats[i % len(chats)]
            seq[job_id] += 1
            yield {"id": job_id, "seq": seq[job_id], "delta": "some more words ", "tokens": seq[job_id] * 3}

    timed("progress", "/api/v2/generate/text/progress", progress_bodies())
    timed(
        "submit",
        "/api/v2/generate/text/submit",
        ({"id": job_id, "generation": "The end of a benchmark reply."} for job_id, _ in jobs),
    )
    out[name] = {"phases": result, "jobs": len(jobs), "chats": len(chats)}


def _load_process(
    port: int, api_key: str, index: int, threads: int, calls: int, reconnect: int, barrier, queue
) -> None:
    out: dict = {}
    phases = ("pop", "progress", "submit")
    workers = [
        threading.Thread(
            target=_thread,
            args=(port, api_key, f"bench-{index}-{t}", calls, reconnect, phases, barrier, out),
        )
        for t in range(threads)
    ]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    queue.put(out)


# --- the main process ------------------------------------------------------------------------


def _fill_queue(queued: int) -> str:
    """Empty the tables, queue `queued` requests; return the bench worker owner's API key."""
    from django.db import connection

    from bench.fill import fill
    from workers.services import create_account

    reset_tables()
    fill(accounts=20)
    account, api_key = create_account(name="bench-owner", trusted=True)
    # It queues requests too (bench/route_inproc.py's async phase): no bound on how many.
    account.max_waiting_requests = 10**6
    account.save(update_fields=["max_waiting_requests"])
    fill(queued=queued, n=20 if queued < 1000 else 1)
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE jobs_generation, jobs_textrequest, workers_worker, workers_account")
    return api_key


def _phase_figures(outs: list[dict], phase: str) -> dict:
    records = [thread["phases"][phase] for out in outs for thread in out.values()]
    latencies = [s for r in records for s in r["latencies"]]
    errors = [e for r in records for e in r["errors"]]
    if not latencies:
        return {"calls": 0}
    wall = max(r["end"] for r in records) - min(r["start"] for r in records)
    ms = [s * 1000 for s in latencies]
    return {
        "calls": len(ms),
        "requests_per_second": round(len(ms) / wall, 1),
        "p50_ms": round(statistics.median(ms), 1),
        "p99_ms": round(percentile(ms, 0.99), 1),
        "max_ms": round(max(ms), 1),
        "non_200": len(errors),
        "non_200_sample": errors[:3],
    }


def _run(queued: int, args) -> dict:
    api_key = _fill_queue(queued)
    port = free_port()
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(args.clients * args.threads)
    queue = context.Queue()
    per_thread = max(1, args.calls // (args.clients * args.threads))
    with serving(port, args.web_workers, _env()):
        processes = [
            context.Process(
                target=_load_process,
                args=(port, api_key, i, args.threads, per_thread, args.reconnect_every, barrier, queue),
            )
            for i in range(args.clients)
        ]
        for process in processes:
            process.start()
        outs = [queue.get(timeout=1800) for _ in processes]
        for process in processes:
            process.join()
    return {
        "queued_requests": queued,
        "jobs_popped": sum(t["jobs"] for out in outs for t in out.values()),
        "chat_jobs_popped": sum(t["chats"] for out in outs for t in out.values()),
        **{phase: _phase_figures(outs, phase) for phase in ("pop", "progress", "submit")},
        "load_average_1m_after": round(os.getloadavg()[0], 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queued", default="100,10000,100000")
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--web-workers", type=int, default=5)
    parser.add_argument("--clients", type=int, default=2)
    parser.add_argument("--threads", type=int, default=16)
    parser.add_argument(
        "--reconnect-every", type=int, default=20, help="requests per connection (0: never reconnect)"
    )
    args = parser.parse_args()

    setup_django(DB_NAME, _env())
    loop_seconds = python_loop_seconds()
    runs = []
    for queued in (int(q) for q in args.queued.split(",")):
        print(f"route_throughput: {queued} queued", file=sys.stderr)
        runs.append(_run(queued, args))
    print(
        json.dumps(
            {
                "bench": "route_throughput",
                "machine": {
                    "cores": os.cpu_count(),
                    "python": platform.python_version(),
                    "python_loop_seconds": loop_seconds,
                    "also_running": "PostgreSQL and Redis (same machine), the load processes",
                },
                "server": web_server(args.web_workers),
                "load": (
                    f"{args.clients} processes x {args.threads} threads, each on a keep-alive"
                    f" connection renewed every {args.reconnect_every} requests"
                ),
                "runs": runs,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
