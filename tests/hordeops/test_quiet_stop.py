"""bin/web stops quietly: a normal stop logs no error, and every process exits 0."""

import os
import signal
import subprocess

import pytest

from tests.hordeops.test_keep_alive import ROOT, _free_port, heartbeat_connection
from tests.live import database_url


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    "stop",
    [
        lambda server: server.send_signal(signal.SIGTERM),  # as bin/stack stops it
        lambda server: os.killpg(server.pid, signal.SIGINT),  # Ctrl-C: every process of the group
    ],
    ids=["sigterm", "ctrl-c"],
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
        stop(server)
        _, logged = server.communicate(timeout=30)
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
    assert server.returncode == 0
    assert "ERROR" not in logged and "was sent" not in logged, logged
