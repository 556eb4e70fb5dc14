"""Live servers for tests that need real HTTP between separate processes.

`live_stack` starts real uvicorn processes serving `hordeops.asgi:application` against the
pytest test database and the test Redis, so that a requester on one process and a worker on
another meet only through PostgreSQL and Redis, as they do in production. `ChatWorker` is a
chat worker speaking the horde worker routes over HTTP; `Background` runs a call in a thread.
"""

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import httpx
import pytest
from django.conf import settings
from django.db import connection

ROOT = Path(__file__).resolve().parent.parent
STARTUP_TIMEOUT_SECONDS = 30
# A whole migrate of a new cluster: seconds alone, several times that beside the other shard.
MANAGE_TIMEOUT_SECONDS = 120
STOP_TIMEOUT_SECONDS = 10
OUTPUT_TAIL_CHARS = 20_000
PORT_ATTEMPTS = 3


class PortTaken(Exception):
    """uvicorn could not bind the port it was given."""


def database_url() -> str:
    """The URL of the database the tests run on (the test database, once pytest-django made it)."""
    db = connection.settings_dict
    password = f":{db['PASSWORD']}" if db.get("PASSWORD") else ""
    return f"postgres://{db['USER']}{password}@{db['HOST']}:{db['PORT']}/{db['NAME']}"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class LiveServer:
    url: str
    process: subprocess.Popen
    log: IO[str]

    def output(self) -> str:
        self.log.flush()
        self.log.seek(0)
        return self.log.read()[-OUTPUT_TAIL_CHARS:]

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=STOP_TIMEOUT_SECONDS)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=STOP_TIMEOUT_SECONDS)


@dataclass
class LiveStack:
    servers: list[LiveServer] = field(default_factory=list)

    @property
    def urls(self) -> list[str]:
        return [server.url for server in self.servers]

    def output(self) -> str:
        return "\n".join(
            f"--- uvicorn at {server.url} (exit {server.process.poll()}) ---\n{server.output()}"
            for server in self.servers
        )

    def assert_alive(self) -> None:
        dead = [server.url for server in self.servers if server.process.poll() is not None]
        assert not dead, f"live servers exited: {dead}\n{self.output()}"


def _start_server(env: dict[str, str]) -> LiveServer:
    port = free_port()
    log = tempfile.TemporaryFile(mode="w+", encoding="utf-8", errors="replace")
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "uvicorn",
            "hordeops.asgi:application",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--lifespan",
            "off",
            "--timeout-graceful-shutdown",
            "2",
            # The client address is the app's to decide (TRUSTED_PROXIES), as under bin/stack.
            "--no-proxy-headers",
        ],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        text=True,
    )
    return LiveServer(url=f"http://127.0.0.1:{port}", process=process, log=log)


def answers_heartbeat(base_url: str) -> bool:
    """Whether the web app at `base_url` (or a proxy in front of it) answers its heartbeat 200."""
    try:
        return httpx.get(f"{base_url}/api/v2/status/heartbeat", timeout=2).status_code == 200
    except httpx.TransportError:
        return False


def _wait_until_up(server: LiveServer, deadline: float) -> None:
    while not answers_heartbeat(server.url):
        if server.process.poll() is not None:
            output = server.output()
            if "address already in use" in output.lower():
                raise PortTaken(server.url)
            raise RuntimeError(f"uvicorn exited with {server.process.returncode}:\n{output}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"uvicorn at {server.url} did not answer its heartbeat:\n{server.output()}")
        time.sleep(0.1)


class PrivateRedis:
    """A redis-server of a test's own, on a free port, that the test may kill and start again
    without touching the shared one (no persistence: a restart comes back empty, as after a
    crash without an AOF)."""

    def __init__(self, workdir: Path) -> None:
        self.port = free_port()
        self.workdir = workdir
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, *, replica_of: int | None = None) -> None:
        follows = ["--replicaof", "127.0.0.1", str(replica_of)] if replica_of else []
        self.process = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no",
             "--dir", str(self.workdir), *follows],
            stdout=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + STARTUP_TIMEOUT_SECONDS
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError("the private redis-server did not start") from None
                time.sleep(0.05)

    def kill(self) -> None:
        """SIGKILL, as a crash: no shutdown, no goodbye to the clients."""
        if self.process is not None:
            self.process.kill()
            self.process.wait(timeout=STOP_TIMEOUT_SECONDS)
            self.process = None


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[PrivateRedis]:
    server = PrivateRedis(tmp_path)
    server.start()
    try:
        yield server
    finally:
        server.kill()


SENTINEL_SERVICE = "mymaster"


def sentinel_conf(port: int, *, bind: str, workdir: Path, primary: tuple[str, int]) -> str:
    """A sentinel's configuration (`redis-server FILE --sentinel`): it watches `primary` as
    SENTINEL_SERVICE with two sentinels to agree, takes it for down a second after it stops
    answering, and fails over within 5 s."""
    host, primary_port = primary
    return (
        f"port {port}\nbind {bind}\ndir {workdir}\nprotected-mode no\n"
        f"sentinel monitor {SENTINEL_SERVICE} {host} {primary_port} 2\n"
        f"sentinel down-after-milliseconds {SENTINEL_SERVICE} 1000\n"
        f"sentinel failover-timeout {SENTINEL_SERVICE} 5000\n"
    )


def sentinel_knows_replica(host: str, port: int) -> bool:
    """Whether the sentinel at host:port knows the primary's replica and another sentinel."""
    import redis

    try:
        client = redis.Redis(host=host, port=port, socket_timeout=1)
        return (
            bool(client.sentinel_slaves(SENTINEL_SERVICE))
            and len(client.sentinel_sentinels(SENTINEL_SERVICE)) >= 2
        )
    except redis.RedisError:
        return False


def sentinel_primary(host: str, port: int) -> tuple[str, int]:
    """The primary the sentinel at host:port names now."""
    import redis

    client = redis.Redis(host=host, port=port, socket_timeout=1)
    address, primary_port = client.sentinel_get_master_addr_by_name(SENTINEL_SERVICE)
    return (address.decode() if isinstance(address, bytes) else address), int(primary_port)


class SentinelRedis:
    """Redis as Sentinel keeps it, all of the test's own: a primary, a replica of it and three
    sentinels (`sentinel_conf`) that name the new primary to every client that asks."""

    SERVICE = SENTINEL_SERVICE

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.primary, self.replica = PrivateRedis(workdir / "primary"), PrivateRedis(workdir / "replica")
        self.sentinel_ports = [free_port() for _ in range(3)]
        self.sentinels: list[subprocess.Popen] = []

    @property
    def sentinels_setting(self) -> str:
        return ",".join(f"127.0.0.1:{port}" for port in self.sentinel_ports)

    def start(self) -> None:
        for server in (self.primary, self.replica):
            server.workdir.mkdir()
        self.primary.start()
        self.replica.start(replica_of=self.primary.port)
        for port in self.sentinel_ports:
            conf = self.workdir / f"sentinel-{port}.conf"
            conf.write_text(
                sentinel_conf(
                    port, bind="127.0.0.1", workdir=self.workdir, primary=("127.0.0.1", self.primary.port)
                )
            )
            self.sentinels.append(
                subprocess.Popen(["redis-server", str(conf), "--sentinel"], stdout=subprocess.DEVNULL)
            )
        deadline = time.monotonic() + STARTUP_TIMEOUT_SECONDS
        while not all(sentinel_knows_replica("127.0.0.1", port) for port in self.sentinel_ports):
            if time.monotonic() > deadline:
                raise RuntimeError("the sentinels did not find the replica")
            time.sleep(0.1)

    def primary_port(self) -> int:
        """The port of the primary the sentinels name now."""
        return sentinel_primary("127.0.0.1", self.sentinel_ports[0])[1]

    def stop(self) -> None:
        for process in self.sentinels:
            process.kill()
            process.wait(timeout=STOP_TIMEOUT_SECONDS)
        self.primary.kill()
        self.replica.kill()


@pytest.fixture
def sentinel_redis(tmp_path: Path) -> Iterator[SentinelRedis]:
    cluster = SentinelRedis(tmp_path)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


def _postgres_bin(name: str) -> str:
    """A program of the machine's newest PostgreSQL (Debian keeps them out of PATH)."""
    found = sorted(Path("/usr/lib/postgresql").glob(f"*/bin/{name}"), key=lambda p: int(p.parts[-3]))
    return str(found[-1]) if found else name


class PrivatePostgres:
    """A PostgreSQL cluster of a test's own (initdb and pg_ctl, in a temp dir, on a free port),
    migrated, that the test may stop (`-m immediate`, as a crash) and start again without
    touching the shared server. Run as the postgres user when the tests run as root."""

    def __init__(self) -> None:
        self.port = free_port()
        # Not under pytest's tmp_path: its parents are closed to the postgres user.
        self.workdir = Path(tempfile.mkdtemp(prefix="hordeops-pg-"))
        self.data = self.workdir / "data"
        self._as = []
        if os.geteuid() == 0:
            os.chown(self.workdir, *_postgres_ids())
            self._as = ["runuser", "-u", "postgres", "--"]

    @property
    def url(self) -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/hordeops"

    def _run(self, *command: str) -> None:
        subprocess.run(
            [*self._as, *command], check=True, capture_output=True, timeout=STARTUP_TIMEOUT_SECONDS
        )

    def create(self) -> None:
        self._run(_postgres_bin("initdb"), "-D", str(self.data), "-A", "trust", "-U", "postgres",
                  "--no-sync", "-E", "UTF8")  # fmt: skip
        self.start()
        self.sql("CREATE DATABASE hordeops", database="postgres")
        self.manage("migrate", "-v0")

    def start(self) -> None:
        options = f"-p {self.port} -k {self.workdir} -c listen_addresses=127.0.0.1 -c fsync=off"
        self._run(_postgres_bin("pg_ctl"), "-D", str(self.data), "-o", options,
                  "-l", str(self.workdir / "log"), "-w", "start")  # fmt: skip

    def stop(self, mode: str = "immediate") -> None:
        """`-m immediate`: every backend killed at once, no checkpoint, as a crash."""
        self._run(_postgres_bin("pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "stop")

    def manage(self, *args: str) -> str:
        """Run manage.py against this cluster; its output."""
        done = subprocess.run(
            [sys.executable, "manage.py", *args],
            cwd=ROOT,
            env={**os.environ, "DATABASE_URL": self.url},
            check=True,
            capture_output=True,
            text=True,
            timeout=MANAGE_TIMEOUT_SECONDS,
        )
        return done.stdout

    def create_account(self, name: str) -> str:
        """A new account's API key (`manage.py create_account` prints it last)."""
        return self.manage("create_account", name).split()[-1]

    def sql(self, statement: str, params: tuple = (), *, database: str = "hordeops") -> list[tuple]:
        import psycopg

        with psycopg.connect(host="127.0.0.1", port=self.port, user="postgres", dbname=database,
                             autocommit=True) as conn:  # fmt: skip
            cursor = conn.execute(statement, params)
            return cursor.fetchall() if cursor.description else []


def _postgres_ids() -> tuple[int, int]:
    import pwd

    entry = pwd.getpwnam("postgres")
    return entry.pw_uid, entry.pw_gid


@pytest.fixture
def private_postgres() -> Iterator[PrivatePostgres]:
    server = PrivatePostgres()
    try:
        server.create()
        yield server
    finally:
        try:
            server.stop()
        except subprocess.CalledProcessError:
            pass  # stopped by the test already, or never started
        shutil.rmtree(server.workdir, ignore_errors=True)


class StreamingReplica:
    """A hot standby of a `PrivatePostgres` (pg_basebackup -R into a cluster of its own, on a
    free port), streaming from it; the test may pause its replay to make it fall behind."""

    def __init__(self, primary: PrivatePostgres) -> None:
        self.primary = primary
        self.port = free_port()
        self.data = primary.workdir / "replica"
        primary._run(_postgres_bin("pg_basebackup"), "-h", "127.0.0.1", "-p", str(primary.port),
                     "-U", "postgres", "-D", str(self.data), "-R", "-X", "stream", "-c", "fast")  # fmt: skip
        options = f"-p {self.port} -k {primary.workdir} -c listen_addresses=127.0.0.1 -c hot_standby=on"
        primary._run(_postgres_bin("pg_ctl"), "-D", str(self.data), "-o", options,
                     "-l", str(primary.workdir / "replica.log"), "-w", "start")  # fmt: skip

    @property
    def url(self) -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/hordeops"

    def sql(self, statement: str, params: tuple = ()) -> list[tuple]:
        import psycopg

        with psycopg.connect(host="127.0.0.1", port=self.port, user="postgres", dbname="hordeops",
                             autocommit=True) as conn:  # fmt: skip
            cursor = conn.execute(statement, params)
            return cursor.fetchall() if cursor.description else []

    def caught_up(self, timeout: float = STARTUP_TIMEOUT_SECONDS) -> None:
        """Wait until it has replayed everything the primary has written so far."""
        (written,) = self.primary.sql("SELECT pg_current_wal_lsn()::text")[0]
        deadline = time.monotonic() + timeout
        while self.sql("SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", (written,))[0] != (True,):
            if time.monotonic() > deadline:
                raise RuntimeError("the replica did not catch up")
            time.sleep(0.05)

    def stop(self) -> None:
        self.primary._run(_postgres_bin("pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop")


@pytest.fixture
def streaming_replica(private_postgres: PrivatePostgres) -> Iterator[StreamingReplica]:
    replica = StreamingReplica(private_postgres)
    try:
        yield replica
    finally:
        try:
            replica.stop()
        except subprocess.CalledProcessError:
            pass  # stopped by the test already


HAPROXY = os.environ.get("HAPROXY", "/usr/sbin/haproxy")
HAPROXY_EXAMPLE = ROOT / "docs" / "examples" / "haproxy.cfg"


class HAProxy:
    """Debian's HAProxy running the shipped example (docs/examples/haproxy.cfg) in front of the
    given web servers: its bind and `server` lines replaced, `replace` applied (a test's own
    timeouts, say), everything else as shipped."""

    def __init__(self, servers: list[str], *, replace: dict[str, str] | None = None) -> None:
        self.port = free_port()
        self.workdir = Path(tempfile.mkdtemp(prefix="hordeops-haproxy-"))
        config = HAPROXY_EXAMPLE.read_text().replace("bind :80", f"bind 127.0.0.1:{self.port}")
        for old, new in (replace or {}).items():
            assert old in config, old
            config = config.replace(old, new)
        lines = []
        for line in config.splitlines():
            if line.strip().startswith("server web"):
                if line.strip().startswith("server web1"):
                    indent = line[: len(line) - len(line.lstrip())]
                    hosts = [url.removeprefix("http://") for url in servers]
                    lines += [f"{indent}server web{n + 1} {host}" for n, host in enumerate(hosts)]
                continue
            lines.append(line)
        (self.workdir / "haproxy.cfg").write_text("\n".join(lines) + "\n")
        # Its output to a file: a pipe nobody reads would stop it once full.
        self.log_path = self.workdir / "haproxy.log"
        with open(self.log_path, "w") as log:
            self.process = subprocess.Popen(
                [HAPROXY, "-db", "-f", str(self.workdir / "haproxy.cfg")],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + STARTUP_TIMEOUT_SECONDS
        while not answers_heartbeat(self.url):
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"HAProxy did not start: {self.log_path.read_text()[-2000:]}")
            time.sleep(0.1)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=STOP_TIMEOUT_SECONDS)
        shutil.rmtree(self.workdir, ignore_errors=True)


PGBOUNCER = os.environ.get("PGBOUNCER", "/usr/sbin/pgbouncer")


class PgBouncer:
    """Debian's PgBouncer of a test's own, in transaction mode (what most managed PostgreSQL
    puts in front), on a free port, in front of the shared PostgreSQL: every database name is
    passed through. It drops the `options` startup parameter, as a deployment must tell it to
    (docs/reference/operations.md). Its pool is one server connection a database, so that
    every client's transactions take turns on the same one, as they do on a busy pooler."""

    def __init__(self, *, pool_size: int = 1) -> None:
        self.port = free_port()
        self.workdir = Path(tempfile.mkdtemp(prefix="hordeops-pgbouncer-"))
        db = connection.settings_dict
        (self.workdir / "users.txt").write_text(f'"{db["USER"]}" ""\n')
        (self.workdir / "pgbouncer.ini").write_text(
            "[databases]\n"
            f"* = host={db['HOST']} port={db['PORT']}\n"
            "[pgbouncer]\n"
            f"listen_addr = 127.0.0.1\nlisten_port = {self.port}\nunix_socket_dir =\n"
            f"auth_type = trust\nauth_file = {self.workdir / 'users.txt'}\n"
            f"pool_mode = transaction\ndefault_pool_size = {pool_size}\nmax_client_conn = 500\n"
            "ignore_startup_parameters = extra_float_digits, options\n"
            f"logfile = {self.workdir / 'pgbouncer.log'}\npidfile = {self.workdir / 'pgbouncer.pid'}\n"
        )
        # PgBouncer will not run as root: as the postgres user (its log and pid file in a
        # directory of its own), when the tests run as root.
        run_as = []
        if os.geteuid() == 0:
            for path in (self.workdir, *self.workdir.iterdir()):
                os.chown(path, *_postgres_ids())
            run_as = ["-u", "postgres"]
        self.process = subprocess.Popen([PGBOUNCER, *run_as, str(self.workdir / "pgbouncer.ini")])
        deadline = time.monotonic() + STARTUP_TIMEOUT_SECONDS
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return
            except OSError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"PgBouncer did not start: {self.log()}") from None
                time.sleep(0.05)

    def url(self) -> str:
        """The test database's URL through this PgBouncer."""
        db = connection.settings_dict
        return f"postgres://{db['USER']}@127.0.0.1:{self.port}/{db['NAME']}"

    def log(self) -> str:
        path = self.workdir / "pgbouncer.log"
        return path.read_text()[-OUTPUT_TAIL_CHARS:] if path.exists() else ""

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=STOP_TIMEOUT_SECONDS)
        shutil.rmtree(self.workdir, ignore_errors=True)


@pytest.fixture
def pgbouncer(transactional_db: None) -> Iterator[PgBouncer]:
    bouncer = PgBouncer()
    try:
        yield bouncer
    finally:
        bouncer.stop()


@pytest.fixture
def live_stack(request: pytest.FixtureRequest, transactional_db: None) -> Iterator[LiveStack]:
    """N uvicorn processes (2 unless parametrized indirectly) on the test database and Redis
    (the test's own redis-server or PostgreSQL cluster when it asks for `private_redis` or
    `private_postgres` too, with its `streaming_replica` as DATABASE_REPLICA_URL when it asks for
    one; the test database through PgBouncer when it asks for `pgbouncer`)."""
    count = getattr(request, "param", 2)
    redis_url = (
        request.getfixturevalue("private_redis").url
        if "private_redis" in request.fixturenames
        else settings.REDIS_URL
    )
    sentinels = {}
    if "sentinel_redis" in request.fixturenames:
        cluster = request.getfixturevalue("sentinel_redis")
        redis_url = cluster.primary.url  # only its database number counts: the sentinels name the host
        sentinels = {"REDIS_SENTINELS": cluster.sentinels_setting, "REDIS_SENTINEL_SERVICE": cluster.SERVICE}
    if "private_postgres" in request.fixturenames:
        database = request.getfixturevalue("private_postgres").url
    elif "pgbouncer" in request.fixturenames:
        database = request.getfixturevalue("pgbouncer").url()
    else:
        database = database_url()
    env = {
        **os.environ,
        "DATABASE_URL": database,
        "REDIS_URL": redis_url,
        "PYTHONUNBUFFERED": "1",
        "ALLOWED_HOSTS": os.environ.get("ALLOWED_HOSTS") or "127.0.0.1,localhost",
        # Every test client is 127.0.0.1: no rate limits (tests/hordeops/test_rate_limits.py).
        "KEY_RATE_PER_SECOND": "0",
        "ADDRESS_RATE_PER_SECOND": "0",
    }
    # `@pytest.mark.live_env(NAME="value")`: settings of the test's own for the servers.
    env.update(sentinels)
    if "oidc_provider" in request.fixturenames:
        env.update(request.getfixturevalue("oidc_provider").settings)
    if "streaming_replica" in request.fixturenames:
        env["DATABASE_REPLICA_URL"] = request.getfixturevalue("streaming_replica").url
    if marker := request.node.get_closest_marker("live_env"):
        env.update(marker.kwargs)
    failed_before = request.session.testsfailed
    stack = LiveStack()
    try:
        stack.servers = [_start_server(env) for _ in range(count)]
        deadline = time.monotonic() + STARTUP_TIMEOUT_SECONDS
        for index in range(count):
            for _attempt in range(PORT_ATTEMPTS):
                try:
                    _wait_until_up(stack.servers[index], deadline)
                    break
                except PortTaken:
                    # Another process took the free port between our probe and uvicorn's bind.
                    stack.servers[index].log.close()
                    stack.servers[index] = _start_server(env)
            else:
                raise RuntimeError(f"no free port after {PORT_ATTEMPTS} attempts")
        yield stack
    finally:
        crashed = any(server.process.poll() is not None for server in stack.servers)
        for server in stack.servers:
            server.stop()
        if crashed or request.session.testsfailed > failed_before:
            print(stack.output())
        for server in stack.servers:
            server.log.close()


class Background:
    """Run a call in a daemon thread; `result()` joins it and re-raises what it raised."""

    def __init__(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        self._value: Any = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(fn, args, kwargs), daemon=True)
        self._thread.start()

    def _run(self, fn: Callable[..., Any], args: tuple, kwargs: dict) -> None:
        try:
            self._value = fn(*args, **kwargs)
        except BaseException as err:  # handed to the test thread by result()
            self._error = err

    def done(self) -> bool:
        return not self._thread.is_alive()

    def result(self, timeout: float = 30) -> Any:
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise TimeoutError(f"background call still running after {timeout} s")
        if self._error is not None:
            raise self._error
        return self._value


class ChatWorker:
    """A chat worker on the horde routes of one live server: pop, progress, submit."""

    def __init__(
        self,
        base_url: str,
        api_key: str,
        *,
        name: str,
        model: str,
        max_length: int = 16384,
        max_context_length: int = 32768,
        tools: bool = False,
        structured_outputs: bool = False,
    ) -> None:
        self.name = name
        self.model = model
        # Sent only when declared: a pop without them is the one every worker sent before.
        self.capabilities = {
            name: True
            for name, declared in (("tools", tools), ("structured_outputs", structured_outputs))
            if declared
        }
        self.max_length = max_length
        self.max_context_length = max_context_length
        self.http = httpx.Client(base_url=base_url, headers={"apikey": api_key}, timeout=30)
        self.job: dict[str, Any] | None = None
        self.seq = 0

    @property
    def id(self) -> str:
        assert self.job is not None, "no job popped"
        return self.job["id"]

    def pop(self) -> dict[str, Any]:
        """One pop; the first one also checks the worker in with its model."""
        response = self.http.post(
            "/api/v2/generate/text/pop",
            json={
                "name": self.name,
                "models": [self.model],
                "max_length": self.max_length,
                "max_context_length": self.max_context_length,
                "chat": True,
                **self.capabilities,
            },
        )
        assert response.status_code == 200, response.text
        return response.json()

    def pop_job(self, timeout: float = 20) -> dict[str, Any]:
        """Pop until a job comes, within `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            answer = self.pop()
            if answer["id"] is not None:
                assert answer["kind"] == "chat", answer
                self.job = answer
                self.seq = 0
                return answer
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.name} found no job within {timeout} s")
            time.sleep(0.05)

    def progress(
        self, delta: str, *, seq: int | None = None, tokens: int | None = None, **extra: Any
    ) -> httpx.Response:
        """Post the next seq (or a given one, to retry); the answer is not checked."""
        if seq is None:
            self.seq += 1
            seq = self.seq
        body: dict[str, Any] = {"id": self.id, "seq": seq, "delta": delta, **extra}
        if tokens is not None:
            body["tokens"] = tokens
        return self.http.post("/api/v2/generate/text/progress", json=body)

    def submit(self, generation: str, **body: Any) -> httpx.Response:
        return self.http.post(
            "/api/v2/generate/text/submit", json={"id": self.id, "generation": generation, **body}
        )

    def stream(self, deltas: list[str], *, retry: frozenset[int] = frozenset()) -> list[dict[str, Any]]:
        """Post each delta in order, re-posting every seq in `retry` at once; tokens run 2 a post."""
        answers = []
        for delta in deltas:
            response = self.progress(delta, tokens=2 * (self.seq + 1))
            assert response.status_code == 200, response.text
            answers.append(response.json())
            if self.seq in retry:
                again = self.progress(delta, seq=self.seq, tokens=2 * self.seq)
                assert again.status_code == 200, again.text
                assert again.json()["lease"] == "not_renewed", again.text
        return answers

    def serve(self, deltas: list[str], *, retry: frozenset[int] = frozenset()) -> str:
        """Pop a job, stream `deltas`, then submit their concatenation; return the job id."""
        self.pop_job()
        self.stream(deltas, retry=retry)
        response = self.submit("".join(deltas))
        assert response.status_code == 200, response.text
        return self.id

    def close(self) -> None:
        self.http.close()


def committed_stream_cut(
    url: str, api_key: str, worker: ChatWorker, path: str, body: dict, fault: Callable[[], None]
) -> tuple[str, float, str]:
    """A streamed chat request served by `worker`, which posts "Hello"; once that reached the
    requester, `fault()` (kill a part of the stack), then the rest of the stream is read.
    Returns the stream from "Hello" on, the seconds from the fault to the stream's end, and the
    generation's id."""

    def serve_some() -> str:
        worker.pop_job()
        assert worker.progress("Hello").status_code == 200
        return worker.id

    serving = Background(serve_some)
    headers = {"Authorization": f"Bearer {api_key}", "anthropic-version": "2023-06-01"}
    with httpx.Client(base_url=url, headers=headers, timeout=30) as http:
        with http.stream("POST", path, json=body) as response:
            assert response.status_code == 200
            received = b""
            chunks = response.iter_bytes()
            while b"Hello" not in received:
                received += next(chunks)
            generation_id = serving.result()
            fault()
            faulted = time.monotonic()
            for chunk in chunks:
                received += chunk
            told_after = time.monotonic() - faulted
    text = received.decode()
    return text[text.index("Hello") :], told_after, generation_id


PATRONI = os.environ.get("PATRONI", "/usr/bin/patroni")
ETCD = os.environ.get("ETCD", "/usr/bin/etcd")
PATRONI_EXAMPLE = ROOT / "docs" / "examples" / "patroni.yml"
DATABASE_EXAMPLE = ROOT / "docs" / "examples" / "database.env"
EXAMPLE_HOSTS = "10.0.0.31:5432,10.0.0.32:5432,10.0.0.33:5432"


def database_example() -> dict[str, str]:
    """The settings of docs/examples/database.env, as shipped."""
    lines = DATABASE_EXAMPLE.read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if line and not line.startswith("#"))


class PatroniCluster:
    """Three PostgreSQL nodes under Debian's Patroni, each running the shipped example
    (docs/examples/patroni.yml) with its addresses, directories and (for a test) short timings
    replaced, and one etcd member as their store, all of the caller's own. The test may kill a
    node (`kill`: Patroni and PostgreSQL, SIGKILL, as a power cut) and start it again.

    By default every node is on 127.0.0.1 on free ports, and a node killed is only a process
    killed, so that what it wrote is in the page cache: fsync is off. bench/cluster_faults.py
    puts each node on a host of its own (`hosts`: name -> address, `wrap`: the command prefix
    that runs a program there) with the example's timings and ports (`timings=None`, `fast`
    False), and runs etcd itself (`etcd`: its host:port)."""

    def __init__(
        self,
        *,
        timings: dict[str, int] | None = None,
        hosts: dict[str, str] | None = None,
        wrap: Callable[[str], list[str]] = lambda name: [],
        etcd: str | None = None,
        network: str = "127.0.0.1/32",
        fast: bool = True,
    ) -> None:
        self.timings = {"ttl": 5, "loop_wait": 1, "retry_timeout": 2} if timings is None else timings
        # Not under pytest's tmp_path: its parents are closed to the postgres user.
        self.workdir = Path(tempfile.mkdtemp(prefix="hordeops-patroni-"))
        self.names = ["pg1", "pg2", "pg3"]
        self.hosts = hosts or {name: "127.0.0.1" for name in self.names}
        fixed = hosts is not None  # a host each: the example's ports
        self.pg_ports = {name: 5432 if fixed else free_port() for name in self.names}
        self.rest_ports = {name: 8008 if fixed else free_port() for name in self.names}
        self.etcd_ports = (free_port(), free_port())
        self.etcd = etcd or f"127.0.0.1:{self.etcd_ports[0]}"
        self.own_etcd = etcd is None
        self.wrap, self.network, self.fast = wrap, network, fast
        self.processes: dict[str, subprocess.Popen] = {}
        self.as_postgres: list[str] = []
        if os.geteuid() == 0:
            os.chown(self.workdir, *_postgres_ids())
            self.workdir.chmod(0o755)
            # setpriv execs (runuser forks): the pid started is Patroni's own.
            self.as_postgres = ["setpriv", "--reuid=postgres", "--regid=postgres", "--init-groups"]
        example = database_example()
        self.password = "change-this-superuser-password"
        hosts_list = ",".join(self.address(name) for name in self.names)
        self.url, self.replica_url = (
            example[key].replace(EXAMPLE_HOSTS, hosts_list)
            for key in ("DATABASE_URL", "DATABASE_REPLICA_URL")
        )

    def address(self, name: str) -> str:
        return f"{self.hosts[name]}:{self.pg_ports[name]}"

    def config(self, name: str) -> dict:
        import yaml

        config = yaml.safe_load(PATRONI_EXAMPLE.read_text())
        pg, rest = self.address(name), f"{self.hosts[name]}:{self.rest_ports[name]}"
        config["name"] = name
        config["restapi"].update(listen=rest, connect_address=rest)
        config["etcd3"]["hosts"] = self.etcd
        dcs = config["bootstrap"]["dcs"]
        assert dcs["synchronous_mode"] is True
        for key, value in self.timings.items():
            assert key in dcs, key
            dcs[key] = value
        assert {"checkpoint": "fast"} in config["postgresql"]["basebackup"]
        if self.fast:
            dcs["postgresql"]["parameters"]["fsync"] = "off"
            config["bootstrap"]["initdb"].append("no-sync")
            config["postgresql"]["basebackup"].append("no-sync")
        postgresql = config["postgresql"]
        postgresql.update(
            listen=pg,
            connect_address=pg,
            data_dir=str(self.workdir / name),
            bin_dir=str(Path(_postgres_bin("pg_ctl")).parent),
            pgpass=str(self.workdir / f"{name}.pgpass"),
        )
        # A directory each: on hosts of their own, the nodes share a port (and so a socket name).
        sockets = self.workdir / f"{name}-socket"
        sockets.mkdir(exist_ok=True)
        if os.geteuid() == 0:
            os.chown(sockets, *_postgres_ids())
        postgresql["parameters"]["unix_socket_directories"] = str(sockets)
        postgresql["pg_hba"] = [line.replace("10.0.0.0/24", self.network) for line in postgresql["pg_hba"]]
        return config

    def start(self) -> None:
        import yaml

        if self.own_etcd:
            client, peer = (f"http://127.0.0.1:{port}" for port in self.etcd_ports)
            with open(self.workdir / "etcd.log", "w") as log:
                self.processes["etcd"] = subprocess.Popen(
                    [ETCD, "--name", "etcd1", "--data-dir", str(self.workdir / "etcd"),
                     "--listen-client-urls", client, "--advertise-client-urls", client,
                     "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                     "--initial-cluster", f"etcd1={peer}"],
                    stdout=log, stderr=subprocess.STDOUT,
                )  # fmt: skip
        for name in self.names:
            (self.workdir / f"{name}.yml").write_text(yaml.safe_dump(self.config(name)))
        for name in self.names:
            self.start_node(name)
        self.wait(lambda: self.leader() is not None)

    def wait(self, ready: Callable[[], bool], timeout: float = STARTUP_TIMEOUT_SECONDS * 2) -> None:
        """Until `ready()`: the leader up at the start; `healthy` before the test's faults, as
        the replicas copy the leader meanwhile."""
        deadline = time.monotonic() + timeout
        while not ready():
            for name in self.names:
                if self.processes[name].poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the Patroni cluster did not come up:\n{self.logs()}")
            time.sleep(0.2)

    def start_node(self, name: str) -> None:
        if os.geteuid() == 0:
            os.chown(self.workdir / f"{name}.yml", *_postgres_ids())
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8", "HOME": str(self.workdir)}
        with open(self.workdir / f"{name}.log", "a") as log:
            self.processes[name] = subprocess.Popen(
                [*self.wrap(name), *self.as_postgres, PATRONI, str(self.workdir / f"{name}.yml")],
                cwd=self.workdir, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip

    def members(self, names: list[str] | None = None) -> dict[str, dict]:
        """The members as the first node of `names` that answers sees them (name: its entry)."""
        for name in names or self.names:
            try:
                answer = httpx.get(f"http://{self.hosts[name]}:{self.rest_ports[name]}/cluster", timeout=1)
                return {member["name"]: member for member in answer.json()["members"]}
            except (httpx.HTTPError, ValueError):
                continue
        return {}

    def healthy(self, names: list[str] | None = None) -> bool:
        """A running leader and a streaming synchronous standby among `names` (all nodes)."""
        members = self.members(names)
        roles = {(m.get("role"), m.get("state")) for n, m in members.items() if n in (names or self.names)}
        # Patroni 3.0 says a replica that streams is "running" (later ones, "streaming").
        sync = {("sync_standby", "running"), ("sync_standby", "streaming")}
        return ("leader", "running") in roles and bool(roles & sync)

    def leader(self, names: list[str] | None = None) -> str | None:
        members = self.members(names)
        found = [n for n, m in members.items() if (m.get("role"), m.get("state")) == ("leader", "running")]
        return found[0] if found else None

    def sql(self, name: str, statement: str, *, database: str = "hordeops") -> list[tuple]:
        import psycopg

        with psycopg.connect(host=self.hosts[name], port=self.pg_ports[name], user="postgres",
                             password=self.password, dbname=database, autocommit=True) as conn:  # fmt: skip
            cursor = conn.execute(statement)
            return cursor.fetchall() if cursor.description else []

    def load(self, source: dict) -> None:
        """The database `hordeops` on the leader, a copy of `source` (a Django settings_dict: the
        test database, migrated and holding what the test made)."""
        leader = self.leader()
        self.sql(leader, "CREATE DATABASE hordeops", database="postgres")
        env = {**os.environ, "PGPASSWORD": source.get("PASSWORD") or ""}
        dump = subprocess.run(
            ["pg_dump", "--no-owner", "--no-privileges", "-h", source["HOST"], "-p", str(source["PORT"]),
             "-U", source["USER"], source["NAME"]],
            check=True, capture_output=True, env=env, timeout=STARTUP_TIMEOUT_SECONDS,
        )  # fmt: skip
        subprocess.run(
            ["psql", "-q", "-v", "ON_ERROR_STOP=1", "-h", self.hosts[leader],
             "-p", str(self.pg_ports[leader]), "-U", "postgres", "hordeops"],
            input=dump.stdout, check=True, capture_output=True, timeout=STARTUP_TIMEOUT_SECONDS,
            env={**os.environ, "PGPASSWORD": self.password},
        )  # fmt: skip

    def postmaster(self, name: str) -> int | None:
        """The node's running postmaster: its pid file's, if that process runs on its data dir
        (a killed one leaves the file, and its pid may since be another process's)."""
        data = self.workdir / name
        try:
            pid = int((data / "postmaster.pid").read_text().split()[0])
            if str(data).encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                return pid
        except (OSError, ValueError, IndexError):
            pass
        return None

    def kill(self, name: str) -> None:
        """Patroni and its PostgreSQL (the postmaster and every process it started) killed with
        SIGKILL at once, as a power cut: nothing shut down, no goodbye to any client."""
        if self.processes[name].poll() is not None and self.postmaster(name) is None:
            return
        pids = [self.processes[name].pid]
        if postmaster := self.postmaster(name):
            pids += [postmaster, *_children(postmaster)]
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.processes[name].wait(timeout=STOP_TIMEOUT_SECONDS)

    def logs(self) -> str:
        return "\n".join(
            f"--- {path.name} ---\n{path.read_text(errors='replace')[-4000:]}"
            for path in sorted(self.workdir.glob("*.log"))
        )

    def stop(self) -> None:
        for name in self.names:
            if name in self.processes:
                self.kill(name)
        if etcd := self.processes.get("etcd"):
            etcd.kill()
            etcd.wait(timeout=STOP_TIMEOUT_SECONDS)
        shutil.rmtree(self.workdir, ignore_errors=True)


def _children(pid: int) -> list[int]:
    """The processes whose parent is `pid` (read from /proc)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


@pytest.fixture
def patroni_cluster() -> Iterator[PatroniCluster]:
    cluster = PatroniCluster()
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
