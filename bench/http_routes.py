"""The hot routes over HTTP against `bin/web`'s server: requests per second, latency, and the CPU
each request costs the web processes and PostgreSQL.

Run:  .venv/bin/python bench/http_routes.py [--root PATH] [--seconds 8] [--threads 4]
          [--web-workers 2] [--unable 200] [--rounds 1]

(about a minute a round; JSON on stdout, progress on stderr.) Run it before and after every change
that touches a hot route, the ASGI handler, the middleware or the database backend, and give both
figures in the closing note (docs/benchmarks.md, "The hot routes over HTTP").

It serves the checkout at --root (default: this one; another, such as a `git worktree` of an
older commit with a `.venv` link, to compare commits with this same load): gunicorn with
--web-workers of that checkout's worker class as `bin/web` starts it (uvicorn's own before there
was one),
rate limits and the per-account bound off so that one client address and one requester can load
it, on a database of its own (hordeops_bench_http, made anew and migrated by that checkout) and
Redis database 9. Five phases of --seconds each, --threads keep-alive connections each:

    heartbeat   GET /api/v2/status/heartbeat: no database, no body; the stack's floor
    idle_pop    pops with nothing queued
    unable_pop  pops past --unable waiting requests the worker cannot take (too long for it)
    async       requests queued by one requester (POST /api/v2/generate/text/async)
    cycle       pop -> submit, on the requests the async phase queued

Each phase starts with ANALYZE, as autovacuum keeps a database in service analyzed. For each:
requests per second, p50/p99 ms, non-200 answers, and CPU ms per request of the web
processes and of PostgreSQL (its every process, from /proc: utime + stime over the phase). The
load generator shares the machine's 2 cores; `python_loop_seconds` says how fast the machine was.
"""

import argparse
import http.client
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.common import (  # noqa: E402
    CpuClock,
    HTTPConnection,
    children,
    database_url,
    empty_redis,
    free_port,
    percentile,
    processes_named,
    python_loop_seconds,
    redis_url,
    serving,
    web_server,
)

DB_NAME = "hordeops_bench_http"
REDIS_DB = 9
MODEL = "bench/http-model"
WORKER_MAX_LENGTH = 100  # the async phase's requests (80) fit; the unable ones (512) do not


def _env(root: Path) -> dict[str, str]:
    return {
        **os.environ,
        "DATABASE_URL": database_url(DB_NAME),
        "REDIS_URL": redis_url(REDIS_DB),
        "DJANGO_SETTINGS_MODULE": "hordeops.settings",
        "LOG_LEVEL": "WARNING",
        "ALLOWED_HOSTS": "127.0.0.1,localhost",
        "KEY_RATE_PER_SECOND": "0",
        "ADDRESS_RATE_PER_SECOND": "0",
        "ACCOUNT_MAX_WAITING_REQUESTS": "10000000",
        "WORKER_LIMIT_UNTRUSTED": "100000",
        "PYTHONPATH": str(root),
    }


def _prepare(root: Path, env: dict[str, str], requester_kudos: int = 0) -> tuple[str, str, str]:
    """A new database migrated by `root`, Redis emptied; a requester's, a worker owner's and
    the unable requests' account's keys (its own: a requester's queueing counts its requests).
    With `requester_kudos`, the requester is awarded them (else it spends from its floor, and
    the floor forgives each debit: an event more each)."""
    server = f"--maintenance-db={database_url('postgres')}"  # DATABASE_URL's server and user
    subprocess.run(["dropdb", server, "--if-exists", DB_NAME], check=True)
    subprocess.run(["createdb", server, DB_NAME], check=True)
    python = str(root / ".venv" / "bin" / "python")
    subprocess.run([python, "manage.py", "migrate", "--noinput", "-v0"], cwd=root, env=env, check=True)
    empty_redis(REDIS_DB)
    keys = []
    for name in ("http-requester", "http-owner", "http-hoarder"):
        made = subprocess.run(
            [python, "manage.py", "create_account", name], cwd=root, env=env, check=True, capture_output=True
        )
        keys.append(made.stdout.decode().split()[-1])
    if requester_kudos:
        award = (
            "from decimal import Decimal; from kudos.awards import award_kudos; "
            "from workers.models import Account; "
            f"award_kudos(account_id=Account.objects.get(name='http-requester').pk, "
            f"amount=Decimal({requester_kudos}), reason='bench', by='bench')"
        )
        subprocess.run(
            [python, "manage.py", "shell", "-c", award], cwd=root, env=env, check=True, capture_output=True
        )
    return keys[0], keys[1], keys[2]


class _Client:
    """One keep-alive connection, Nagle off (as urllib3 and httpx set theirs)."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.connection: http.client.HTTPConnection | None = None

    def post(self, path: str, body: dict, key: str) -> tuple[int, dict]:
        return self.call("POST", path, json.dumps(body), {"apikey": key, "Content-Type": "application/json"})

    def call(
        self, method: str, path: str, body: str | None = None, headers: dict | None = None
    ) -> tuple[int, dict]:
        for attempt in (1, 2):
            if self.connection is None:
                self.connection = HTTPConnection("127.0.0.1", self.port, timeout=30)
            try:
                self.connection.request(method, path, body, headers or {})
                answer = self.connection.getresponse()
                return answer.status, json.loads(answer.read() or b"{}")
            except (OSError, http.client.HTTPException):
                self.connection.close()
                self.connection = None
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")


def _pop_body(name: str) -> dict:
    return {"name": name, "models": [MODEL], "max_length": WORKER_MAX_LENGTH, "max_context_length": 4096}


def _analyze() -> None:
    """Table statistics as autovacuum keeps them in service: a database made a second ago has
    none, and the pop's plan then reads the whole queue for every row it walks."""
    subprocess.run(["psql", database_url(DB_NAME), "-qc", "ANALYZE"], check=True)


def _copy_requests(copies: int, *, max_length: int | None = None) -> None:
    """`copies` more of the newest waiting request (of --max_length, if given), queued behind
    it in order: faster than over HTTP, for the large queues. Its jobs_queuedmodel rows come
    from the database's own trigger, as for any request."""
    if copies <= 0:
        return
    psql = ["psql", database_url(DB_NAME), "-qAtc"]
    listed = subprocess.run(
        [*psql, "SELECT column_name FROM information_schema.columns WHERE table_name = 'jobs_textrequest'"],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    copied = [c for c in listed.stdout.split() if c not in ("id", "created_at")]
    names, values = ", ".join(copied), ", ".join(f"n.{c}" for c in copied)
    same = f"AND max_length = {int(max_length)}" if max_length else ""
    copy = f"""
        WITH newest AS (SELECT * FROM jobs_textrequest WHERE state = 'active' {same}
                        ORDER BY created_at DESC LIMIT 1)
        INSERT INTO jobs_textrequest (id, created_at, {names})
        SELECT gen_random_uuid(), n.created_at + i * interval '1 microsecond', {values}
        FROM newest AS n, generate_series(1, {int(copies)}) AS i"""
    subprocess.run([*psql, copy], check=True)


def _phase(name: str, args, port: int, master: int, call) -> dict:
    """Run `call(client, thread_index)` on --threads connections for --seconds; the figures."""
    _analyze()
    latencies: list[float] = []
    failures: list[int] = []
    lock = threading.Lock()
    stop = time.monotonic() + args.seconds
    start = threading.Barrier(args.threads + 1)

    def run(index: int) -> None:
        client = _Client(port)
        mine, bad = [], []
        start.wait()
        while time.monotonic() < stop:
            began = time.perf_counter()
            status = call(client, index)
            mine.append((time.perf_counter() - began) * 1000)
            if status != 200 and status != 202:
                bad.append(status)
        with lock:
            latencies.extend(mine)
            failures.extend(bad)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(args.threads)]
    for thread in threads:
        thread.start()
    clock = CpuClock(web=children(master), postgres=processes_named("postgres"))
    start.wait()
    for thread in threads:
        thread.join()
    elapsed, spent = clock.elapsed(), clock.spent()
    calls = len(latencies)
    print(f"http_routes: {name} {calls} calls", file=sys.stderr)
    return {
        "calls": calls,
        "requests_per_second": round(calls / elapsed, 1),
        "p50_ms": round(percentile(latencies, 0.5), 1),
        "p99_ms": round(percentile(latencies, 0.99), 1),
        "non_200": len(failures),
        "web_cpu_ms_per_request": round(spent["web"] * 1000 / max(calls, 1), 2),
        "postgres_cpu_ms_per_request": round(spent["postgres"] * 1000 / max(calls, 1), 2),
    }


def _round(args, root: Path) -> dict:
    env = _env(root)
    requester, owner, hoarder = _prepare(root, env, args.requester_kudos)
    port = free_port()
    with serving(port, args.web_workers, env, root=root) as server:
        setup = _Client(port)
        for i in range(args.threads):
            setup.post("/api/v2/generate/text/pop", _pop_body(f"http-worker-{i}"), owner)
        figures = {}

        def heartbeat(client: _Client, index: int) -> int:
            return client.call("GET", "/api/v2/status/heartbeat")[0]

        figures["heartbeat"] = _phase("heartbeat", args, port, server.pid, heartbeat)

        def pop(client: _Client, index: int) -> int:
            return client.post("/api/v2/generate/text/pop", _pop_body(f"http-worker-{index}"), owner)[0]

        figures["idle_pop"] = _phase("idle_pop", args, port, server.pid, pop)
        too_long = {"prompt": "too long for the worker", "models": [MODEL], "params": {"max_length": 512}}
        for _ in range(min(args.unable, 200)):
            setup.post("/api/v2/generate/text/async", too_long, hoarder)
        _copy_requests(args.unable - 200)
        figures["unable_pop"] = _phase("unable_pop", args, port, server.pid, pop)
        fits = {"prompt": "Once upon a time", "models": [MODEL], "params": {"max_length": 80}}

        def enqueue(client: _Client, index: int) -> int:
            return client.post("/api/v2/generate/text/async", fits, requester)[0]

        figures["async"] = _phase("async", args, port, server.pid, enqueue)
        # Enough for the cycle phase at 400 cycles/s (the async phase queued fewer).
        _copy_requests(int(args.seconds * 400), max_length=80)

        def cycle(client: _Client, index: int) -> int:
            status, job = client.post("/api/v2/generate/text/pop", _pop_body(f"http-worker-{index}"), owner)
            if status != 200 or not job.get("id"):
                return status if status != 200 else 599  # an empty pop: the queue ran out
            body = {"id": job["id"], "generation": "The end of the story."}
            return client.post("/api/v2/generate/text/submit", body, owner)[0]

        figures["cycle"] = _phase("cycle", args, port, server.pid, cycle)
        return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, default=ROOT, help="the checkout to serve")
    parser.add_argument("--seconds", type=float, default=8)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--web-workers", type=int, default=2)
    parser.add_argument("--unable", type=int, default=200, help="waiting requests the worker cannot take")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument(
        "--requester-kudos", type=int, default=0, help="awarded to the requester (a checkout with kudos)"
    )
    args = parser.parse_args()
    root = args.root.resolve()
    if not shutil.which("createdb"):
        raise SystemExit("needs PostgreSQL's client programs (createdb, dropdb)")
    subprocess.run([str(ROOT / "bin" / "services")], check=True)
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True)
    rounds = [_round(args, root) for _ in range(args.rounds)]
    print(
        json.dumps(
            {
                "bench": "http_routes",
                "commit": head.stdout.strip(),
                "machine": {"cores": os.cpu_count(), "python_loop_seconds": python_loop_seconds()},
                "server": web_server(args.web_workers, root),
                "load": f"{args.threads} keep-alive connections, {args.seconds} s a phase, same machine",
                "rounds": rounds,
            }
        )
    )


if __name__ == "__main__":
    main()
