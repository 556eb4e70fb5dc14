"""Thousands of open chat streams on the default stack, served by a pool of chat workers.

Run:  .venv/bin/python bench/streams.py [--streams 100,1000,2000,5000] [--web-workers 2]
          [--workers 64] [--posts-per-second 300] [--deltas 10] [--split]

(about ten minutes for the four sizes; the JSON goes to stdout, progress notes to stderr.)

It uses its own database (hordeops_bench_streams, created and migrated if missing) and Redis
database 11, and starts gunicorn with --web-workers uvicorn workers, as `bin/stack` does. With
--split it starts a second gunicorn on another port (the same PostgreSQL and Redis) and the
workers post there while the requesters stay on the first: two hosts behind a load balancer.

For each N in --streams:

1. `idle`: with nothing open, 200 heartbeats and 200 pops that find nothing (a worker of a
   model no request asks for), one after the other: p50/p99 ms; and the web processes' RSS.
2. `waiting`: one requester process opens N streamed `/v1/chat/completions` at once (from
   N/25 accounts, so that no bound per account is reached) and the bench waits until all N
   are queued. With them all waiting and no worker for them: the same heartbeats and empty
   pops; the web RSS again (its growth over N is `web_rss_kb_per_open_stream`); PostgreSQL
   connections to the bench database and Redis clients, by name.
3. `serving`: --workers chat workers (threads in two processes, each on a keep-alive
   connection) pop the jobs and post --deltas progress posts each, paced so that the posts add
   up to --posts-per-second (each worker from a random point of the job's cycle), then submit.
   Each delta carries the worker's send time
   (`time.time()`, the same clock on this one machine), so the requester measures the relay
   latency from the worker's post to the SSE chunk's arrival, end to end. Reported: streams
   finished with `[DONE]`, errors (a status other than 200, an error event, a stream cut or
   timed out), relay latency p50/p99, the worker routes' p50/p99 meanwhile, and the largest
   number of PostgreSQL connections and Redis clients seen (sampled every half second).
"""

import argparse
import asyncio
import json
import multiprocessing
import os
import platform
import random
import re
import resource
import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.common import (  # noqa: E402
    CpuClock,
    HTTPConnection,
    bench_env,
    children,
    free_port,
    percentile,
    processes_named,
    python_loop_seconds,
    reset_tables,
    setup_django,
    start_web,
    terminate,
    web_server,
)

DB_NAME = "hordeops_bench_streams"
MODEL = "bench/streams-8B"
OTHER_MODEL = "bench/nobody-asks-8B"
PER_ACCOUNT = 25
STAMP = re.compile(rb"t=(\d+\.\d+)")
CONNECT_AT_ONCE = 200
# An idle worker pops about once a second; a faster spin would be load of its own.
IDLE_POP_SECONDS = 1.0
STREAM_TIMEOUT_SECONDS = 900


def _env() -> dict[str, str]:
    # Every requester here is 127.0.0.1: the streams, not the rate limits, are measured.
    return bench_env(DB_NAME, 11, ADDRESS_RATE_PER_SECOND="0")


def _summary(ms: list[float]) -> dict:
    if not ms:
        return {"count": 0}
    return {
        "count": len(ms),
        "p50_ms": round(statistics.median(ms), 2),
        "p99_ms": round(percentile(ms, 0.99), 2),
        "max_ms": round(max(ms), 2),
    }


# --- the requester process ------------------------------------------------------------------


async def _stream(port: int, api_key: str, body: bytes, gate: asyncio.Semaphore, out: dict) -> None:
    """One streamed chat request: its status, whether it ended with [DONE], relay latencies."""
    async with gate:  # so many connects at once, not so many streams
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(
            (
                f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
                f"Authorization: Bearer {api_key}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n\r\n"
            ).encode()
            + body
        )
        await writer.drain()
    out["sent"] += 1
    try:
        status = int((await reader.readline()).split()[1])
        if status != 200:
            out["errors"].append(f"status {status}")
            return
        while True:
            line = await reader.readline()
            if not line:
                out["errors"].append("cut before [DONE]")
                return
            if not line.startswith(b"data: "):
                continue
            arrived = time.time()
            if line.startswith(b"data: [DONE]"):
                out["done"] += 1
                return
            if b'"error"' in line:
                out["errors"].append(line[:200].decode(errors="replace"))
                return
            for stamp in STAMP.findall(line):
                out["latencies_ms"].append((arrived - float(stamp)) * 1000)
    finally:
        writer.close()


def requester_process(port: int, api_keys: list[str], count: int, sent, finished, results) -> None:
    async def main() -> dict:
        out: dict = {"sent": 0, "done": 0, "errors": [], "latencies_ms": []}
        body = json.dumps(
            {
                "model": MODEL,
                "messages": [{"role": "user", "content": "Tell me a short story."}],
                "stream": True,
                "max_tokens": 200,
            }
        ).encode()
        gate = asyncio.Semaphore(CONNECT_AT_ONCE)

        async def one(index: int) -> None:
            try:
                await asyncio.wait_for(
                    _stream(port, api_keys[index // PER_ACCOUNT], body, gate, out), STREAM_TIMEOUT_SECONDS
                )
            except TimeoutError:
                out["errors"].append("timed out")
            except OSError as error:
                out["errors"].append(repr(error))

        streams = [asyncio.ensure_future(one(index)) for index in range(count)]
        while out["sent"] < count and not all(s.done() for s in streams):
            await asyncio.sleep(0.05)
        sent.set()
        await asyncio.gather(*streams)
        return out

    out = asyncio.run(main())
    finished.set()  # before the put: a process does not exit until its queue is read
    results.put(out)


# --- the worker processes -------------------------------------------------------------------


class Connection:
    def __init__(self, port: int, api_key: str) -> None:
        self.http = HTTPConnection("127.0.0.1", port, timeout=60)
        self.headers = {"apikey": api_key, "Content-Type": "application/json"}

    def post(self, path: str, body: dict) -> tuple[int, dict, float]:
        started = time.perf_counter()
        self.http.request("POST", path, json.dumps(body), self.headers)
        answer = self.http.getresponse()
        content = answer.read()
        return answer.status, json.loads(content), (time.perf_counter() - started) * 1000


def _worker_thread(port: int, api_key: str, name: str, args: dict, stop, out: dict) -> None:
    connection = Connection(port, api_key)
    interval = args["workers"] / args["posts_per_second"]
    pop = {"name": name, "models": [MODEL], "chat": True, "max_length": 4096, "max_context_length": 8192}
    record: dict = {"pop": [], "progress": [], "submit": [], "non_200": [], "jobs": 0}
    # Each worker starts at a point of its own in the job's cycle (--deltas posts), as
    # independent workers would. Started together, the 64 posted in step: every interval
    # brought a burst of 64 posts to the 4 sync threads, and the burst's queue, not the routes,
    # set the p99. Started within one interval, they still ended their jobs in step: every
    # cycle brought all 64 submits and pops (the heaviest requests) within one interval.
    time.sleep(random.uniform(0, interval * args["deltas"]))
    next_post = time.monotonic()
    while not stop.is_set():
        status, job, ms = connection.post("/api/v2/generate/text/pop", pop)
        record["pop"].append(ms)
        if status != 200:
            record["non_200"].append((status, str(job)[:120]))
            time.sleep(0.3)
            continue
        if not job["id"]:
            time.sleep(IDLE_POP_SECONDS)
            continue
        deltas = []
        for seq in range(1, args["deltas"] + 1):
            next_post = max(next_post + interval, time.monotonic())
            time.sleep(max(0.0, next_post - time.monotonic()))
            delta = f"t={time.time():.6f} "
            deltas.append(delta)
            status, answer, ms = connection.post(
                "/api/v2/generate/text/progress", {"id": job["id"], "seq": seq, "delta": delta}
            )
            record["progress"].append(ms)
            if status != 200:
                record["non_200"].append((status, str(answer)[:120]))
        status, answer, ms = connection.post(
            "/api/v2/generate/text/submit", {"id": job["id"], "generation": "".join(deltas)}
        )
        record["submit"].append(ms)
        if status != 200:
            record["non_200"].append((status, str(answer)[:120]))
        record["jobs"] += 1
    out[name] = record


def worker_process(port: int, api_key: str, index: int, threads: int, args: dict, stop, results) -> None:
    out: dict = {}
    pool = [
        threading.Thread(target=_worker_thread, args=(port, api_key, f"streams-{index}-{t}", args, stop, out))
        for t in range(threads)
    ]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()
    results.put(out)


# --- the main process ------------------------------------------------------------------------


def _reset(streams: int) -> tuple[list[str], str]:
    """Empty the tables and Redis; make the requesters' accounts; return their keys and an owner's."""
    from workers.services import create_account

    reset_tables()
    keys = [create_account(name=f"streams-{i}")[1] for i in range(-(-streams // PER_ACCOUNT))]
    _, owner = create_account(name="streams-owner", trusted=True)
    return keys, owner


def _rss_kb(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                total += int(line.split()[1])
    return total


def _threads(pids: list[int]) -> int:
    return sum(len(os.listdir(f"/proc/{pid}/task")) for pid in pids)


def _database_connections() -> int:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        return cursor.fetchone()[0]


def _redis_clients() -> dict[str, int]:
    from django_redis import get_redis_connection

    names: dict[str, int] = {}
    for client in get_redis_connection("default").client_list():
        if int(client["db"]) == 11:
            names[client["name"] or "(unnamed)"] = names.get(client["name"] or "(unnamed)", 0) + 1
    return names


def _probe(port: int, api_key: str, calls: int = 200) -> dict:
    """Heartbeats and pops that find nothing, one after the other."""
    connection = Connection(port, api_key)
    heartbeat, pop = [], []
    for _ in range(calls):
        started = time.perf_counter()
        connection.http.request("GET", "/api/v2/status/heartbeat")
        connection.http.getresponse().read()
        heartbeat.append((time.perf_counter() - started) * 1000)
        status, answer, ms = connection.post(
            "/api/v2/generate/text/pop", {"name": "streams-probe", "models": [OTHER_MODEL], "chat": True}
        )
        assert status == 200 and answer["id"] is None, answer
        pop.append(ms)
    return {"heartbeat": _summary(heartbeat), "empty_pop": _summary(pop)}


def _queued() -> int:
    from jobs.models import TextRequest

    return TextRequest.objects.filter(state=TextRequest.State.ACTIVE, queued__gt=0).count()


def _run(streams: int, args) -> dict:
    keys, owner = _reset(streams)
    requester_port = free_port()
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    stop = context.Event()
    servers = [start_web(requester_port, args.web_workers, _env())]
    worker_port = requester_port
    try:
        if args.split:
            worker_port = free_port()
            servers.append(start_web(worker_port, args.web_workers, _env()))
        web_by_server = [[server.pid, *children(server.pid)] for server in servers]
        web = [pid for pids in web_by_server for pid in pids]
        # The worker of MODEL checks in first: a request for a model no worker serves is refused.
        checkin = Connection(worker_port, owner)
        status, answer, _ = checkin.post(
            "/api/v2/generate/text/pop",
            {"name": "streams-0-0", "models": [MODEL], "chat": True, "max_length": 4096},
        )
        assert status == 200 and answer["id"] is None, answer
        idle = _probe(requester_port, owner)
        rss_idle = _rss_kb(web)
        threads_idle = _threads(web)

        sent, finished = context.Event(), context.Event()
        requester = context.Process(
            target=requester_process, args=(requester_port, keys, streams, sent, finished, results)
        )
        started = time.monotonic()
        requester.start()
        sent.wait(timeout=600)
        deadline = time.monotonic() + 600
        while _queued() < streams and time.monotonic() < deadline:
            time.sleep(0.2)
        queued = _queued()
        print(f"streams: {queued} of {streams} queued in {time.monotonic() - started:.1f} s", file=sys.stderr)
        waiting = {
            "queued": queued,
            "seconds_to_queue": round(time.monotonic() - started, 1),
            **_probe(requester_port, owner),
            "web_rss_kb": _rss_kb(web),
            "web_threads": _threads(web),
            "postgresql_connections": _database_connections(),
            "redis_clients": _redis_clients(),
        }
        rss_per_stream = (waiting["web_rss_kb"] - rss_idle) / max(1, queued)

        worker_args = {
            "workers": args.workers,
            "posts_per_second": args.posts_per_second,
            "deltas": args.deltas,
        }
        per_process = args.workers // 2
        workers = [
            context.Process(
                target=worker_process, args=(worker_port, owner, i, per_process, worker_args, stop, results)
            )
            for i in range(2)
        ]
        serving_started = time.monotonic()
        for process in workers:
            process.start()
        clock = CpuClock(
            web=web,
            **({"web_requesters": web_by_server[0], "web_workers": web_by_server[1]} if args.split else {}),
            postgresql=processes_named("postgres"),
            redis=processes_named("redis-server"),
            requester=[requester.pid],
            workers=[process.pid for process in workers],
        )
        max_db, max_redis = 0, 0
        while not finished.is_set() and requester.is_alive():
            max_db = max(max_db, _database_connections())
            max_redis = max(max_redis, sum(_redis_clients().values()))
            time.sleep(0.5)
        serving_seconds = time.monotonic() - serving_started
        cores = {role: round(seconds / serving_seconds, 2) for role, seconds in clock.spent().items()}
        stop.set()
        outs = [results.get(timeout=120) for _ in range(3)]
        for process in [requester, *workers]:
            process.join(timeout=60)
    finally:
        stop.set()
        terminate(servers)
    [streamed] = [out for out in outs if "latencies_ms" in out]
    records = [record for out in outs if "latencies_ms" not in out for record in out.values()]
    posts = sum(len(record["progress"]) for record in records)
    return {
        "streams": streams,
        "idle": {**idle, "web_rss_kb": rss_idle, "web_threads": threads_idle},
        "waiting": {**waiting, "web_rss_kb_per_open_stream": round(rss_per_stream, 1)},
        "serving": {
            "finished_with_done": streamed["done"],
            "errors": len(streamed["errors"]),
            "errors_sample": streamed["errors"][:5],
            "relay_latency": _summary(streamed["latencies_ms"]),
            "seconds": round(serving_seconds, 1),
            "progress_posts_per_second": round(posts / serving_seconds, 1),
            "jobs": sum(record["jobs"] for record in records),
            "worker_routes": {
                route: _summary([ms for record in records for ms in record[route]])
                for route in ("pop", "progress", "submit")
            },
            "worker_non_200": sum(len(record["non_200"]) for record in records),
            "worker_non_200_sample": [e for record in records for e in record["non_200"]][:5],
            "cores_used": cores,
            "max_postgresql_connections": max_db,
            "max_redis_clients": max_redis,
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", default="100,1000,2000,5000")
    parser.add_argument("--web-workers", type=int, default=2)
    parser.add_argument("--workers", type=int, default=64)
    parser.add_argument("--posts-per-second", type=float, default=300)
    parser.add_argument("--deltas", type=int, default=10)
    parser.add_argument("--split", action="store_true", help="workers post to a second web server")
    args = parser.parse_args()

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # the servers and the requester inherit it
    setup_django(DB_NAME, _env())
    loop_seconds = python_loop_seconds()
    runs = []
    for streams in (int(n) for n in args.streams.split(",")):
        print(f"streams: {streams} open", file=sys.stderr)
        runs.append(_run(streams, args))
        print(json.dumps(runs[-1]), file=sys.stderr)
    print(
        json.dumps(
            {
                "bench": "streams",
                "machine": {
                    "cores": os.cpu_count(),
                    "python": platform.python_version(),
                    "python_loop_seconds": loop_seconds,
                    "also_running": "PostgreSQL and Redis, the requester and worker processes",
                },
                "server": web_server(args.web_workers)
                + (" (x2: requesters on one, workers on the other)" if args.split else ""),
                "load": (
                    f"{args.workers} chat workers in 2 processes, {args.deltas} progress posts a job,"
                    f" {args.posts_per_second:g} posts/s in all"
                ),
                "runs": runs,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
