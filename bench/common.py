"""What the benchmarks share: their databases, the servers they start and end (`start_web`,
`serving`, `start_stack`, `terminate`), the CPU they read from /proc (`CpuClock`), the figures
they print: each script keeps only its question and its figures.

`bench/` imports the product (to fill tables and call services in-process); the product
never imports `bench/`. Each benchmark has a database and a Redis database of its own, so
that they never disturb each other, the tests or a running stack: on the servers that
DATABASE_URL and REDIS_URL name (their defaults, as `bin/stack`'s, when unset).
"""

import asyncio
import atexit
import http.client
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parents[1]
VENV = ROOT / ".venv" / "bin"


def database_url(name: str) -> str:
    """The database `name` on DATABASE_URL's server."""
    url = urlsplit(os.environ.get("DATABASE_URL") or "postgres://postgres@127.0.0.1:5432/hordeops")
    return url._replace(path=f"/{name}").geturl()


def redis_url(db: int) -> str:
    """The Redis database `db` on REDIS_URL's server."""
    url = urlsplit(os.environ.get("REDIS_URL") or "redis://127.0.0.1:6379/0")
    return url._replace(path=f"/{db}").geturl()


def empty_redis(db: int) -> None:
    subprocess.run(["redis-cli", "-u", redis_url(db), "flushdb"], check=True, capture_output=True)


def bench_env(database: str, redis_db: int, **settings: str) -> dict[str, str]:
    """The environment of a bench's servers (and of its own process, once applied): its own
    database and Redis database, warnings only, and any settings it overrides. A bench's
    fleets run many workers per account: the per-account worker limits are lifted."""
    return {
        **os.environ,
        "DATABASE_URL": database_url(database),
        "REDIS_URL": redis_url(redis_db),
        "DJANGO_SETTINGS_MODULE": "hordeops.settings",
        "LOG_LEVEL": "WARNING",
        "ALLOWED_HOSTS": os.environ.get("ALLOWED_HOSTS") or "127.0.0.1,localhost",
        "WORKER_LIMIT_UNTRUSTED": "100000",
        "WORKER_LIMIT_TRUSTED": "100000",
        **settings,
    }


def prepare_database(name: str, env: dict[str, str] | None = None) -> None:
    """Start PostgreSQL and Redis if needed, create the database if missing, migrate it."""
    subprocess.run([str(ROOT / "bin" / "services"), name], check=True)
    env = env or {**os.environ, "DATABASE_URL": database_url(name)}
    migrate = [sys.executable, "manage.py", "migrate", "--noinput", "-v0"]
    subprocess.run(migrate, cwd=ROOT, env=env, check=True)


def reset_tables() -> None:
    """Empty the horde's tables (truncated: no dead rows of an earlier run linger) and Redis;
    the anonymous account stays. Needs Django set up."""
    from django.db import connection
    from django_redis import get_redis_connection

    from jobs.models import Generation, TextRequest
    from kudos.apps import create_system_wallets
    from kudos.models import Event, Posting, Wallet
    from workers.models import Account, Worker

    # The ledger too: TRUNCATE fires none of its append-only triggers, which are per row.
    models = (Generation, TextRequest, Worker, Posting, Event, Wallet)
    tables = ", ".join(m._meta.db_table for m in models)
    with connection.cursor() as cursor:
        cursor.execute(f"TRUNCATE {tables} CASCADE")
    Account.objects.exclude(name="Anonymous").delete()
    create_system_wallets(sender=None)
    get_redis_connection("default").flushdb()


class HTTPConnection(http.client.HTTPConnection):
    """The standard library's keep-alive connection with Nagle's algorithm off, as urllib3 (and
    so requests, the scribe worker's client) and httpx set their sockets.

    http.client writes a request's headers and its body in two sends. With Nagle on, the body
    waits for the server to acknowledge the headers, and Linux delays that acknowledgement up to
    40 ms, so a bench client left as it is measures its own stall as the horde's latency: at 60
    posts/s on a third of a core, bench/streams.py's pop p50 fell from 52 to 27 ms with Nagle off.
    """

    def connect(self) -> None:
        super().connect()
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def wait_for_heartbeat(port: int, *, timeout: float = 60) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            probe = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            probe.request("GET", "/api/v2/status/heartbeat")
            if probe.getresponse().status == 200:
                return True
        except OSError:
            pass
        time.sleep(0.2)
    return False


# --- the servers a bench starts, and stops: only those, by pid ------------------------------


def web_worker_class(root: Path = ROOT) -> str:
    """`bin/web`'s worker class in the checkout `root`; uvicorn's own in one older than it."""
    if (root / "hordeops" / "web_worker.py").exists():
        return "hordeops.web_worker.QuietUvicornWorker"
    return "uvicorn.workers.UvicornWorker"


def web_server(web_workers: int, root: Path = ROOT) -> str:
    """The web server as a bench's figures name it."""
    return f"gunicorn -k {web_worker_class(root)} -w {web_workers}"


def web_command(bind: str, web_workers: int, root: Path = ROOT) -> list[str]:
    """gunicorn as `bin/web` runs it: no proxy trusted, every client is its peer; idle
    connections kept 75 s."""
    return [str(root / ".venv" / "bin" / "gunicorn"), "hordeops.asgi:application",
            "-k", web_worker_class(root), "-w", str(web_workers), "-b", bind,
            "--log-level", "warning", "--forwarded-allow-ips", "", "--keep-alive", "75"]  # fmt: skip


def celery_commands(schedule: Path) -> dict[str, list[str]]:
    """A Celery worker and beat (the stale pass's clock), as `bin/stack` runs them."""
    celery = [str(VENV / "python"), "-m", "celery", "-A", "hordeops"]
    return {
        "celery": [*celery, "worker", "--pool=solo", "--loglevel=WARNING",
                   "--without-heartbeat", "--without-gossip", "--without-mingle"],
        "beat": [*celery, "beat", "--loglevel=WARNING", f"--schedule={schedule}"],
    }  # fmt: skip


def terminate(processes: list[subprocess.Popen], *, timeout: float = 30) -> None:
    """End the processes this bench started (by their pids, never by name) and wait for them.
    Those `start_web` and `start_stack` start are also ended at exit, should the script fail
    before it ends them."""
    for process in processes:
        if process.poll() is None:
            process.terminate()
    for process in processes:
        process.wait(timeout=timeout)


def start_web(
    port: int, web_workers: int, env: dict[str, str], *, root: Path = ROOT, log=None
) -> subprocess.Popen:
    """gunicorn with `web_workers` uvicorn workers of the checkout `root` on `port`, as
    `bin/stack` runs it, once its heartbeat answers."""
    server = subprocess.Popen(
        web_command(f"127.0.0.1:{port}", web_workers, root),
        cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT if log else None,
    )  # fmt: skip
    atexit.register(terminate, [server])
    if not wait_for_heartbeat(port):
        terminate([server])
        raise RuntimeError("gunicorn did not come up")
    return server


@contextmanager
def serving(
    port: int, web_workers: int, env: dict[str, str], *, root: Path = ROOT
) -> Iterator[subprocess.Popen]:
    """`start_web`'s server for the time of the block, stopped however the block ends."""
    server = start_web(port, web_workers, env, root=root)
    try:
        yield server
    finally:
        terminate([server])


def start_stack(
    port: int, rundir: Path, env: dict[str, str], *, web_workers: int = 3
) -> list[subprocess.Popen]:
    """The whole stack, as `bin/stack` runs it: the web app, a Celery worker and beat (its
    stale pass), each logging to `rundir`. End it with `terminate`."""
    logs = {name: open(rundir / f"{name}.log", "w") for name in ("web", "celery", "beat")}  # noqa: SIM115
    celery = [
        subprocess.Popen(command, cwd=ROOT, env=env, stdout=logs[name], stderr=subprocess.STDOUT)
        for name, command in celery_commands(rundir / "beat-schedule").items()
    ]
    atexit.register(terminate, celery)
    try:
        web = start_web(port, web_workers, env, log=logs["web"])
    except RuntimeError:
        terminate(celery)
        raise RuntimeError("the stack did not come up") from None
    return [web, *celery]


def create_account(name: str, env: dict[str, str]) -> str:
    """A new account's API key, made as an operator makes one (`manage.py create_account`)."""
    done = subprocess.run(
        [sys.executable, "manage.py", "create_account", name],
        cwd=ROOT, env=env, check=True, capture_output=True, text=True,
    )  # fmt: skip
    return done.stdout.split()[-1]


def start_bridge(stack_url: str, api_key: str, name: str, backend_url: str, log: Path, *options: str):
    """The bridge as a volunteer runs it (`.venv/bin/hordeops-bridge`), worker `name` in front of
    `backend_url`, logging to `log`; returned once the horde lists its worker. End it with
    `terminate`."""
    import httpx

    bridge = subprocess.Popen(
        [str(ROOT / ".venv" / "bin" / "hordeops-bridge"), "-u", stack_url, f"--api_key={api_key}",
         "-n", name, "--backend_url", backend_url, *options],
        stdout=open(log, "w"), stderr=subprocess.STDOUT,  # noqa: SIM115
    )  # fmt: skip
    deadline = time.monotonic() + 60
    while httpx.get(f"{stack_url}/api/v2/workers/name/{name}").status_code != 200:
        if time.monotonic() > deadline or bridge.poll() is not None:
            terminate([bridge])
            raise RuntimeError(f"the bridge did not come up:\n{log.read_text()[-3000:]}")
        time.sleep(0.2)
    return bridge


def setup_django(name: str, env: dict[str, str] | None = None) -> None:
    """The bench's database ready (`prepare_database`), this process set on it and on `env`
    (its servers' environment), and Django set up."""
    env = env or {**os.environ, "DATABASE_URL": database_url(name)}
    prepare_database(name, env)
    os.environ.update(env)
    import django

    django.setup()


# --- CPU, from /proc ------------------------------------------------------------------------


def children(pid: int) -> list[int]:
    """The processes `pid` started (a gunicorn master's workers), none once it has ended."""
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except FileNotFoundError:
        return []


def processes_named(name: str) -> list[int]:
    """Every process on the machine whose command is `name` ("postgres": the server, its
    backends and helpers), to read their CPU: never to end them."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if (entry / "comm").read_text().strip() == name:
                    found.append(int(entry.name))
            except OSError:
                pass
    return found


def cpu_seconds(pids: list[int]) -> float:
    """User and system CPU time of these processes so far (those that ended are skipped)."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / ticks


class CpuClock:
    """The CPU seconds each group of processes spends from the clock's start, and the wall time."""

    def __init__(self, **groups: list[int]) -> None:
        self.groups = groups
        self._before = {name: cpu_seconds(pids) for name, pids in groups.items()}
        self._started = time.monotonic()

    def elapsed(self) -> float:
        return time.monotonic() - self._started

    def spent(self, **joined: list[int]) -> dict[str, float]:
        """CPU seconds by group so far; `joined` adds the processes a group gained meanwhile
        (PostgreSQL backends opened during the run), their whole CPU counted."""
        return {
            name: cpu_seconds(sorted(set(pids) | set(joined.get(name, [])))) - self._before[name]
            for name, pids in self.groups.items()
        }


def python_loop_seconds() -> float:
    """Seconds for ten million additions in a Python loop, best of three: the VM's speed.

    The same 2-core VM has run the same code at half the speed on another day; figures
    from different days compare only beside this one.
    """
    best = float("inf")
    for _ in range(3):
        started, total = time.process_time(), 0
        for i in range(10_000_000):
            total += i
        best = min(best, time.process_time() - started)
    return round(best, 3)


class KeepAliveConnection:
    """One keep-alive HTTP/1.1 connection on asyncio streams, for load generators that must
    cost little CPU per request: httpx cost about as much CPU per pop as the pop it timed, and
    on a 2-core VM the load generator shares the cores with what it measures."""

    def __init__(self, host: str, port: int, headers: dict[str, str]) -> None:
        self.host, self.port = host, port
        self._head = "".join(f"{name}: {value}\r\n" for name, value in headers.items())
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def post(self, path: str, body: bytes) -> tuple[int, bytes]:
        """POST `body` as JSON; the status and the body of the answer."""
        if self._writer is None:
            self._reader, self._writer = await asyncio.open_connection(self.host, self.port)
        self._writer.write(
            f"POST {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n{self._head}"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        try:
            return await self._answer()
        except BaseException:
            await self.close()
            raise

    async def _answer(self) -> tuple[int, bytes]:
        reader = self._reader
        status = int((await reader.readuntil(b"\r\n")).split()[1])
        headers = {}
        while (line := await reader.readuntil(b"\r\n")) != b"\r\n":
            name, _, value = line.decode("latin-1").partition(":")
            headers[name.strip().lower()] = value.strip().lower()
        if "content-length" in headers:
            body = await reader.readexactly(int(headers["content-length"]))
        else:  # chunked
            chunks = []
            while size := int((await reader.readuntil(b"\r\n")).split(b";")[0], 16):
                chunks.append(await reader.readexactly(size))
                await reader.readuntil(b"\r\n")
            await reader.readuntil(b"\r\n")
            body = b"".join(chunks)
        if headers.get("connection") == "close":
            await self.close()
        return status, body

    async def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._reader = self._writer = None


def ledger_checks() -> dict:
    """The kudos ledger after a run: its sum (must be 0), `check_kudos` (every balance,
    kudos_details and records against the postings and events: must be clean), events by kind,
    and accepted generations without exactly one generation event (must be 0)."""
    from collections import Counter

    from django.core.management import call_command
    from django.core.management.base import CommandError

    from jobs.models import Generation
    from kudos.earning import generation_key
    from kudos.models import Event, Posting

    try:
        call_command("check_kudos", stdout=open(os.devnull, "w"), stderr=open(os.devnull, "w"))
        checked = "clean"
    except CommandError as exc:
        checked = str(exc)
    paid = set(Event.objects.filter(kind=Event.Kind.GENERATION).values_list("key", flat=True))
    done = Generation.objects.filter(state=Generation.State.DONE).values_list("id", flat=True)
    return {
        "ledger_sum": str(Posting.objects.total()),
        "check_kudos": checked,
        "events": dict(Counter(Event.objects.values_list("kind", flat=True))),
        "accepted_without_event": sum(1 for g in done if generation_key(g) not in paid),
    }
