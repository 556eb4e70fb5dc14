"""The bridge's test bed, all real: the stack as `bin/stack` runs it (gunicorn with a uvicorn
worker, a Celery worker and beat, on a database of its own), llama.cpp's server on a tiny
model, and the bridge installed with pip into a fresh virtualenv, as a volunteer installs it."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psycopg
import pytest
from psycopg import sql

from tests.bridge.engine import ENGINE_PYTHON, Engine, write_model
from tests.live import ROOT, PrivateRedis, database_url, free_port

STACK_STARTUP_SECONDS = 120
# Short leases and a stale pass every second: a reply that outlives the base lease is kept only
# by its progress posts, and one that loses its lease is taken back within seconds.
STACK_SETTINGS = {
    "TEXT_JOB_LEASE_SECONDS": "4",
    "TEXT_JOB_PREPARATION_SECONDS": "2",
    "STALE_GENERATION_PASS_SECONDS": "1",
    "KEY_RATE_PER_SECOND": "0",
    "ADDRESS_RATE_PER_SECOND": "0",
    "WEB_WORKERS": "1",
    # The module's one owner starts a bridge of its own name in many tests: more than 3 workers.
    "WORKER_LIMIT_UNTRUSTED": "100",
}
# The model file's name; the bridge serves it as `openai/<name>` (the backend kind, as the AI
# Horde names models `backend/Model`, when the server does not name its engine).
MODEL_FILE = "hordeops-tiny"
MODEL = f"openai/{MODEL_FILE}"


def _on_database(name: str) -> str:
    return f"{database_url().rsplit('/', 1)[0]}/{name}"


@dataclass
class Stack:
    url: str
    env: dict[str, str]
    process: subprocess.Popen
    log: Path

    def manage(self, *args: str) -> str:
        done = subprocess.run(
            [sys.executable, "manage.py", *args],
            cwd=ROOT, env=self.env, check=True, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        return done.stdout

    def create_account(self, name: str, *, trusted: bool = False) -> str:
        """A new account's API key (printed last)."""
        return self.manage("create_account", name, *(["--trusted"] if trusted else [])).split()[-1]

    def sql(self, statement: str, params: tuple = ()) -> list[tuple]:
        with psycopg.connect(self.env["DATABASE_URL"], autocommit=True) as conn:
            cursor = conn.execute(statement, params)
            return cursor.fetchall() if cursor.description else []

    def output(self) -> str:
        return self.log.read_text(errors="replace")[-20_000:]


@pytest.fixture(scope="module")
def stack(request: pytest.FixtureRequest) -> Iterator[Stack]:
    """`bin/stack` as the README starts it, on a new database it creates and migrates, and a
    redis-server of its own: its Celery queue and leases meet no other test's, nor another run's."""
    name = f"hordeops_bridge_{uuid.uuid4().hex[:8]}"
    port = free_port()
    redis = PrivateRedis(Path(tempfile.mkdtemp(prefix="hordeops-stack-redis-")))
    redis.start()
    request.addfinalizer(redis.kill)
    env = {
        **os.environ,
        **STACK_SETTINGS,
        "PORT": str(port),
        "DATABASE_URL": _on_database(name),
        "REDIS_URL": redis.url,
        "PYTHONUNBUFFERED": "1",
    }
    log = Path(tempfile.mkstemp(prefix="hordeops-stack-", suffix=".log")[1])
    with log.open("w") as out:
        process = subprocess.Popen(
            ["bin/stack"], cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    stack = Stack(f"http://127.0.0.1:{port}", env, process, log)
    try:
        deadline = time.monotonic() + STACK_STARTUP_SECONDS
        while True:
            assert process.poll() is None, f"bin/stack exited:\n{stack.output()}"
            try:
                if httpx.get(f"{stack.url}/api/v2/status/heartbeat", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, f"bin/stack did not come up:\n{stack.output()}"
            time.sleep(0.3)
        yield stack
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        if request.session.testsfailed:
            print(f"--- bin/stack ---\n{stack.output()}")
        log.unlink(missing_ok=True)
        with psycopg.connect(_on_database("postgres"), autocommit=True) as admin:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


@pytest.fixture(scope="session")
def bridge_command(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`hordeops-bridge` from `pip install bridge/` into a fresh Python 3.11 virtualenv: what a
    volunteer on another machine gets, with nothing of the project's beside it."""
    venv = tmp_path_factory.mktemp("bridge-venv")
    source = tmp_path_factory.mktemp("bridge-source") / "bridge"
    shutil.copytree(
        ROOT / "bridge", source, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__")
    )
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    subprocess.run(
        [str(venv / "bin" / "pip"), "install", "-q", "--disable-pip-version-check", str(source)],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    return venv / "bin" / "hordeops-bridge"


@pytest.fixture(scope="session")
def model_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tests' model: small enough to load at once, big enough that a long reply takes
    seconds on one core (a cancellation must find it still generating)."""
    assert ENGINE_PYTHON.exists(), "the engine is not installed: run bin/engine-venv (bin/test does)"
    return write_model(
        tmp_path_factory.mktemp("model") / f"{MODEL_FILE}.gguf", embedding=512, blocks=6, feed_forward=1536
    )


@pytest.fixture(scope="module")
def engine(model_file: Path, request: pytest.FixtureRequest) -> Iterator[Engine]:
    server = Engine(model_file).start()
    try:
        yield server
    finally:
        if request.session.testsfailed:
            print(f"--- engine ---\n{server.output()[-5000:]}")
        server.stop()


@dataclass
class Bridge:
    process: subprocess.Popen
    log: Path
    lines_seen: int = field(default=0)

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_for(self, pattern: str, timeout: float = 30) -> re.Match:
        """The first line matching `pattern` (a regex), waiting up to `timeout` seconds for it."""
        deadline = time.monotonic() + timeout
        while True:
            if found := re.search(pattern, self.output()):
                return found
            assert self.process.poll() is None or time.monotonic() < deadline, (
                f"the bridge exited ({self.process.returncode}) without {pattern!r}:\n{self.output()}"
            )
            assert time.monotonic() < deadline, f"no {pattern!r} in the bridge's log:\n{self.output()}"
            time.sleep(0.05)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30) -> int:
        if self.process.poll() is None:
            self.process.send_signal(sig)
        return self.process.wait(timeout=timeout)


@pytest.fixture
def run_bridge(bridge_command: Path, tmp_path: Path):
    """Start `hordeops-bridge` with the given arguments; each is stopped at the test's end."""
    started: list[Bridge] = []

    def start(*args: str, env: dict[str, str] | None = None) -> Bridge:
        log = tmp_path / f"bridge-{len(started)}.log"
        with log.open("w") as out:
            process = subprocess.Popen(
                [str(bridge_command), *args],
                stdout=out,
                stderr=subprocess.STDOUT,
                env={"PATH": os.environ["PATH"], "PYTHONUNBUFFERED": "1", **(env or {})},
            )
        bridge = Bridge(process, log)
        started.append(bridge)
        return bridge

    yield start
    for bridge in started:
        if bridge.process.poll() is None:
            bridge.process.kill()
            bridge.process.wait(timeout=10)
        print(f"--- bridge ---\n{bridge.output()[-5000:]}")  # shown by pytest only when the test fails


def until(check, timeout: float = 20, message: str = "timed out") -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, message
        time.sleep(0.05)


def sse_data(response: httpx.Response) -> list[dict]:
    """The JSON `data:` payloads of an event stream, in order."""
    return [
        json.loads(line[5:]) for line in response.iter_lines() if line.startswith("data:") and "{" in line
    ]


@pytest.fixture(scope="module")
def accounts(stack: Stack) -> dict[str, str]:
    return {"owner": stack.create_account("bridge-owner"), "requester": stack.create_account("requester")}


@pytest.fixture
def bridge(stack: Stack, engine: Engine, accounts: dict[str, str], run_bridge) -> Bridge:
    """The bridge in front of the module's engine, checked in, with room for long replies."""
    return start_bridge(stack, engine, accounts["owner"], run_bridge, "tiny-bridge")


def start_bridge(stack: Stack, engine: Engine, key: str, run_bridge, name: str, *args: str) -> Bridge:
    started = run_bridge(
        "--horde_url", stack.url, f"--api_key={key}", "--worker_name", name, "--backend_url", engine.url,
        "--max_length", "1800", *args,
    )  # fmt: skip
    started.wait_for(rf"serving \S+ as {name}")
    # Its first pop checks the worker in; from then on its model is known to requesters.
    until(lambda: httpx.get(f"{stack.url}/api/v2/workers/name/{name}").status_code == 200)
    return started


def first_content(lines) -> dict:
    """Read the stream up to its first chunk with text; that chunk."""
    for line in lines:
        if line.startswith("data: {"):
            chunk = json.loads(line[6:])
            if chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
                return chunk
    raise AssertionError("the stream ended before any text")


def engine_stopped(engine: Engine, disconnects_before: int) -> float:
    """Wait until the engine says its client left, then check that it computes nothing more;
    the seconds its CPU time still grew over the half second after."""
    until(lambda: engine.disconnects() > disconnects_before, timeout=5, message="the engine kept its client")
    before = engine.cpu_seconds()
    time.sleep(0.5)
    grew = engine.cpu_seconds() - before
    assert grew < 0.1, f"the engine still computes: {grew:.2f} s of CPU in 0.5 s"
    return grew
