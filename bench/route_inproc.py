"""CPU per request of pop, progress and submit inside the web process: no HTTP server, no load.

Run:  .venv/bin/python bench/route_inproc.py [--calls 2000] [--queued 5000] [--profile 40 [--sort cumulative]]

(under a minute; the JSON goes to stdout, a profile, if asked for, to stderr.)

Instructions per call, steadier than CPU time on a busy machine (one phase, instrumented alone):

    valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file=/tmp/cg.out \
        .venv/bin/python bench/route_inproc.py --callgrind --phases submit --calls 100 --queued 600
    grep -E '^(summary|totals):' /tmp/cg.out    # / 100

`bench/http_routes.py` reads the gunicorn workers' CPU from /proc, in clock ticks, with the
HTTP server's share in it. This calls `hordeops.asgi.application` directly, as uvicorn would, and
runs the sync view inline on the calling thread (the ASGI handler's thread pool swapped for an
inline executor), so `time.process_time()` around the calls is the application's own CPU per
request, steady to a few percent: the figure to compare a change to the hot routes by, run
beside the old commit at the same moment. `--profile N` also prints the N costliest functions
(cProfile, own time, measured in thread CPU time; the profiler itself inflates call-heavy code).

It uses the database of bench/route_throughput.py (hordeops_bench_routes) and Redis database
10, queues --queued requests with `bench/fill.py`, pops 30 jobs to warm up, then measures
--calls pops, --calls progress posts on the chat jobs popped, --calls submits, --calls pops
of an idle worker (a model nobody asked for, as in bench/idle_fleet.py) and --calls text
requests queued (`async`).
"""

import argparse
import asyncio
import concurrent.futures
import cProfile
import io
import json
import os
import pstats
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.common import python_loop_seconds, setup_django  # noqa: E402
from bench.route_throughput import DB_NAME, _env, _fill_queue, pop_body  # noqa: E402


class InlineExecutor(concurrent.futures.Executor):
    """Runs what is submitted at once, on the caller's thread, so one thread's CPU is all."""

    def submit(self, fn, /, *args, **kwargs):
        future = concurrent.futures.Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except BaseException as exc:
            future.set_exception(exc)
        return future


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--queued", type=int, default=5000)
    parser.add_argument("--profile", type=int, default=0, help="print the N costliest functions")
    parser.add_argument(
        "--phases",
        default=",".join(PHASES),
        help="the phases to measure, of " + ", ".join(PHASES) + " (submits without pops submit jobs "
        "popped beforehand, --prepop of them, unmeasured)",
    )
    parser.add_argument("--prepop", type=int, default=300)
    parser.add_argument(
        "--callgrind",
        action="store_true",
        help="under `valgrind --tool=callgrind --instr-atstart=no`: instrument the measured calls only",
    )
    parser.add_argument(
        "--sort", choices=("tottime", "cumulative"), default="tottime", help="the profile's order"
    )
    args = parser.parse_args()
    unlimited = {"KEY_RATE_PER_SECOND": "1000000", "KEY_RATE_BURST": "1000000"}
    unlimited |= {"ADDRESS_RATE_PER_SECOND": "1000000", "ADDRESS_RATE_BURST": "1000000"}
    # One key makes every call: no rate limit measured, only the routes. The view runs on the
    # event loop's thread here, which Django refuses by default.
    setup_django(DB_NAME, {**_env(), **unlimited, "DJANGO_ALLOW_ASYNC_UNSAFE": "true"})
    api_key = _fill_queue(max(args.queued, 2 * args.calls + 100))
    from django.db import connection

    connection.close()
    from hordeops.asgi import application, django_application

    django_application.application._sync_threads = InlineExecutor()
    phases = args.phases.split(",")
    figures = asyncio.run(
        _measure(
            application, api_key, args.calls, args.profile, args.sort, phases, args.prepop, args.callgrind
        )
    )
    print(
        json.dumps(
            {
                "bench": "route_inproc",
                "machine": {
                    "cores": os.cpu_count(),
                    "load_average_1m": round(os.getloadavg()[0], 2),
                    "python_loop_seconds": python_loop_seconds(),
                },
                "calls": args.calls,
                "cpu_ms_per_request": figures,
            },
            indent=2,
        )
    )


PHASES = ("pop", "progress", "submit", "pop_idle", "async")


async def _measure(
    application,
    api_key: str,
    calls: int,
    profile: int,
    sort: str,
    only: list[str],
    prepop: int,
    callgrind: bool = False,
) -> dict[str, float]:
    async def post(path: str, body: dict, expected: int = 200) -> dict:
        raw = json.dumps(body).encode()
        scope = {
            "type": "http",
            "http_version": "1.1",
            "method": "POST",
            "scheme": "http",
            "path": path,
            "raw_path": path.encode(),
            "root_path": "",
            "query_string": b"",
            "headers": [
                (b"host", b"127.0.0.1"),
                (b"apikey", api_key.encode()),
                (b"content-type", b"application/json"),
                (b"content-length", str(len(raw)).encode()),
            ],
            "client": ("127.0.0.1", 40000),
            "server": ("127.0.0.1", 8000),
        }
        messages = [{"type": "http.request", "body": raw, "more_body": False}]
        status, chunks = [], []

        async def receive():
            if messages:
                return messages.pop()
            await asyncio.Event().wait()  # no disconnect: the answer is whole first

        async def send(message):
            if message["type"] == "http.response.start":
                status.append(message["status"])
            else:
                chunks.append(message.get("body", b""))

        await application(scope, receive, send)
        content = b"".join(chunks)
        assert status == [expected], (path, status, content[:200])
        return json.loads(content)

    body = pop_body("inproc-w")
    # Only ids are kept: thousands of whole answers kept alive would make the garbage
    # collector's passes, and so the figures, grow with the run.
    jobs: list[str] = []
    chats: list[str] = []
    seqs: dict[str, int] = {}

    async def pop(_: int) -> None:
        job = await post("/api/v2/generate/text/pop", body)
        jobs.append(job["id"])
        if job["kind"] == "chat":
            chats.append(job["id"])

    for i in range(30):  # warm-up
        await pop(i)
    if "submit" in only and "pop" not in only:
        for i in range(prepop):  # the jobs the submits submit, popped unmeasured
            await pop(i)

    async def progress(i: int) -> None:
        job_id = chats[i % len(chats)]
        seqs[job_id] = seqs.get(job_id, 0) + 1
        body = {"id": job_id, "seq": seqs[job_id], "delta": "more words ", "tokens": seqs[job_id]}
        await post("/api/v2/generate/text/progress", body)

    async def submit(i: int) -> None:
        await post("/api/v2/generate/text/submit", {"id": jobs[30 + i], "generation": "The end."})

    # An idle worker's poll, as in bench/idle_fleet.py: one model that nobody asked for.
    idle_body = {"name": "inproc-idle", "models": ["inproc-idle-model"], "chat": True, "max_length": 4096,
                 "max_context_length": 8192}  # fmt: skip

    async def pop_idle(_: int) -> None:
        job = await post("/api/v2/generate/text/pop", idle_body)
        assert job["id"] is None, job

    await pop_idle(0)  # checks the idle worker in

    # A requester's text request, as `/api/v2/generate/text/async` queues it (the horde tax
    # posted with it); last, so that the queue the pops read is the one filled.
    async def queue(_: int) -> None:
        body = {"prompt": "Once upon a time", "models": ["inproc-queued"], "params": {"max_length": 80}}
        await post("/api/v2/generate/text/async", body, expected=202)

    phases = (
        ("pop", pop),
        ("progress", progress),
        ("submit", submit),
        ("pop_idle", pop_idle),
        ("async", queue),
    )
    figures = {}
    for name, call in phases:
        if name not in only:
            continue
        profiler = cProfile.Profile(time.thread_time) if profile else None
        if callgrind:  # its instruction count is then the phase's alone
            subprocess.run(
                ["callgrind_control", "--instr=on", str(os.getpid())], check=True, capture_output=True
            )
        started = time.process_time()
        if profiler:
            profiler.enable()
        for i in range(calls):
            await call(i)
        if profiler:
            profiler.disable()
        figures[name] = round((time.process_time() - started) / calls * 1000, 3)
        if callgrind:
            subprocess.run(
                ["callgrind_control", "--instr=off", str(os.getpid())], check=True, capture_output=True
            )
        if profiler:
            out = io.StringIO()
            pstats.Stats(profiler, stream=out).sort_stats(sort).print_stats(profile)
            print(f"--- {name} (profiled: {figures[name]} ms per call)\n{out.getvalue()}", file=sys.stderr)
    return figures


if __name__ == "__main__":
    main()
