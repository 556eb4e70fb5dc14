"""bin/web keeps an idle connection open longer than a worker's poll interval: a worker that
polls every few seconds reuses its connection instead of racing the server's close."""

import http.client
import os
import socket
import subprocess
import time
from pathlib import Path

import pytest

from tests.live import database_url

ROOT = Path(__file__).resolve().parents[2]
# Longer than uvicorn's default keep-alive (5 s) and gunicorn's (2 s): with either, the idle
# connection below would be closed before its second request.
IDLE_SECONDS = 6


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def heartbeat_connection(port: int, *, timeout: float = 30) -> http.client.HTTPConnection:
    """A connection to bin/web on `port` once its heartbeat answers 200 (it may be starting)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            connection.request("GET", "/api/v2/status/heartbeat")
            answer = connection.getresponse()
            assert answer.status == 200 and answer.read()
            return connection
        except OSError:
            assert time.monotonic() < deadline, "bin/web did not come up"
            time.sleep(0.2)


@pytest.mark.django_db(transaction=True)
def test_an_idle_keep_alive_connection_outlives_a_workers_poll_interval(settings):
    port = _free_port()
    env = {**os.environ, "PORT": str(port), "WEB_WORKERS": "1", "DATABASE_URL": database_url(),
           "REDIS_URL": settings.REDIS_URL}  # fmt: skip
    server = subprocess.Popen([str(ROOT / "bin" / "web")], env=env, cwd=ROOT)
    try:
        connection = heartbeat_connection(port)
        local = connection.sock.getsockname()
        time.sleep(IDLE_SECONDS)  # a slow worker's poll interval, not a lease
        connection.request("GET", "/api/v2/status/heartbeat")
        answer = connection.getresponse()
        assert answer.status == 200 and answer.read()
        assert connection.sock.getsockname() == local  # the same connection, not a new one
    finally:
        server.terminate()
        server.wait(timeout=30)
