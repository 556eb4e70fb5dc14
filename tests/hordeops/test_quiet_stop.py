"""bin/web stops quietly: a normal stop logs no error, and every process exits 0."""

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.hordeops.test_keep_alive import ROOT, _free_port, heartbeat_connection
from tests.live import database_url


def _wait_for_workers_booted(master: int, count: int, timeout: float = 30) -> None:
    """Until each of `master`'s `count` workers has set its own signal handlers.

    A signal that reaches a worker before it sets its handlers goes to the master's, which it was
    forked with, and is lost; gunicorn kills the worker 30 s later. The heartbeat answering shows
    only that one worker is up. A worker with its own handlers leaves SIGHUP to its default, which
    the master catches.
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
        lambda server: server.send_signal(signal.SIGTERM),  # as bin/stack stops it
        lambda server: os.killpg(server.pid, signal.SIGINT),  # Ctrl-C: every process of the group
        # gunicorn's quick stop, which Ctrl-C also starts: the master sends its workers SIGQUIT, and
        # one still finishing the SIGINT got it at random (1 run in ~30 of ctrl-c above)
        lambda server: server.send_signal(signal.SIGQUIT),
    ],
    ids=["sigterm", "ctrl-c", "quick-stop"],
)
def test_a_normal_stop_of_the_web_app_logs_no_error_and_exits_0(settings, stop):
    port = _free_port()
    env = {**os.environ, "PORT": str(port), "WEB_WORKERS": "2", "DATABASE_URL": database_url(),
           "REDIS_URL": settings.REDIS_URL}  # fmt: skip
    server = subprocess.Popen(
        [str(ROOT / "bin" / "web")],
        env=env,
        cwd=ROOT,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        heartbeat_connection(port).close()
        _wait_for_workers_booted(server.pid, 2)
        stop(server)
        _, logged = server.communicate(timeout=30)
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
    assert server.returncode == 0
    assert "ERROR" not in logged and "was sent" not in logged, logged
