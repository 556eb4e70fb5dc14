"""bin/web stops quietly: a normal stop logs no error, and every process exits 0."""

import http.client
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from tests.hordeops.test_keep_alive import ROOT, _free_port, heartbeat_connection
from tests.live import database_url


def _wait_for_workers_booted(master: int, count: int, timeout: float = 30) -> None:
    """Until each of `master`'s `count` workers has set its own signal handlers, so that the stop
    reaches booted workers (a stop while they boot: `test_a_stop_while_the_workers_boot_...`).

    The heartbeat answering shows only that one worker is up. A worker with its own handlers
    leaves SIGHUP to its default, which the master catches.
    """
    deadline = time.monotonic() + timeout
    while True:
        children = Path(f"/proc/{master}/task/{master}/children").read_text().split()
        caught = [
            int(line.split()[1], 16)
            for child in children
            for line in Path(f"/proc/{child}/status").read_text().splitlines()
            if line.startswith("SigCgt:")
        ]
        if len(caught) == count and not any(mask & 1 << (signal.SIGHUP - 1) for mask in caught):
            return
        assert time.monotonic() < deadline, "bin/web's workers did not boot"
        time.sleep(0.1)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    "stop",
    [
        lambda server, port: server.send_signal(signal.SIGTERM),  # as bin/stack stops it
        lambda server, port: os.killpg(server.pid, signal.SIGINT),  # Ctrl-C: every process of the group
        # gunicorn's quick stop, which Ctrl-C also starts: the master sends its workers SIGQUIT, and
        # one still finishing the SIGINT got it at random (1 run in ~30 of ctrl-c above)
        lambda server, port: server.send_signal(signal.SIGQUIT),
    ],
    ids=["sigterm", "ctrl-c", "quick-stop"],
)
def test_a_normal_stop_of_the_web_app_logs_no_error_and_exits_0(settings, stop):
    _stop_and_check(settings, stop)


@pytest.mark.django_db(transaction=True)
def test_a_quick_stop_while_requests_arrive_exits_0(settings):
    # SIGQUIT lands wherever the worker's main thread is: raised there as SystemExit inside a
    # uvloop transport's callback, it was logged as a transport's fatal error and swallowed, and
    # the worker ran on until the master's SIGKILL.
    def quick_stop_under_load(server, port: int) -> None:
        stopped = threading.Event()
        callers = [threading.Thread(target=_heartbeats, args=(port, stopped)) for _ in range(4)]
        for caller in callers:
            caller.start()
        try:
            time.sleep(1)
            server.send_signal(signal.SIGQUIT)
            time.sleep(0.5)
        finally:
            stopped.set()
            for caller in callers:
                caller.join()

    _stop_and_check(settings, quick_stop_under_load)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("stop", ["sigterm", "ctrl-c", "quick-stop"])
@pytest.mark.parametrize("moment", ["fork", "finalizer"])
def test_a_stop_while_the_workers_boot_exits_0_at_once(settings, moment, stop):
    # The workers stop bin/web themselves (tests/hordeops/boot_stop_hooks.py). Before its own
    # handlers, a worker took a stop with the master's and lost it; after them, the stop raised
    # SystemExit wherever it landed, and in a finalizer that was swallowed with every later stop
    # ignored. Either way the worker served on until the master's SIGKILL 30 s later.
    hooks = ROOT / "tests" / "hordeops" / "boot_stop_hooks.py"
    server = _start_web(settings, BOOT_STOP_AT=moment, BOOT_STOP=stop, GUNICORN_CMD_ARGS=f"--config {hooks}")
    _check_stopped(server, timeout=15)


def _heartbeats(port: int, stopped: threading.Event) -> None:
    """Heartbeats on keep-alive connections, opened again as often as they drop, until `stopped`."""
    while not stopped.is_set():
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
        try:
            while not stopped.is_set():
                connection.request("GET", "/api/v2/status/heartbeat")
                connection.getresponse().read()
        except (OSError, http.client.HTTPException):
            time.sleep(0.01)
        finally:
            connection.close()


def _stop_and_check(settings, stop) -> None:
    """Start bin/web with 2 workers, stop it with `stop(server, port)`: it exits 0, logging nothing."""
    port = _free_port()
    server = _start_web(settings, PORT=str(port))
    try:
        heartbeat_connection(port).close()
        _wait_for_workers_booted(server.pid, 2)
        stop(server, port)
    except BaseException:
        _kill(server)
        raise
    _check_stopped(server, timeout=30)


def _start_web(settings, **env: str) -> subprocess.Popen:
    """bin/web with 2 workers, on a free port unless `env` names one."""
    env = {**os.environ, "PORT": str(_free_port()), "WEB_WORKERS": "2", "DATABASE_URL": database_url(),
           "REDIS_URL": settings.REDIS_URL, **env}  # fmt: skip
    return subprocess.Popen(
        [str(ROOT / "bin" / "web")],
        env=env,
        cwd=ROOT,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def _check_stopped(server: subprocess.Popen, *, timeout: float) -> None:
    """`server` exits 0 within `timeout` seconds, logging no error."""
    try:
        _, logged = server.communicate(timeout=timeout)
    finally:
        _kill(server)
    assert server.returncode == 0
    assert "ERROR" not in logged and "was sent" not in logged and "Traceback" not in logged, logged


def _kill(server: subprocess.Popen) -> None:
    if server.poll() is None:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()
