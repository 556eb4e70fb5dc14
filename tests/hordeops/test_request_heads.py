"""bin/web bounds each request head in time and size, and the connections a process holds
(hordeops/web_protocol.py), against its real server: gunicorn with its uvicorn workers."""

import http.client
import json
import os
import select
import signal
import socket
import subprocess
import time

import pytest

from tests.hordeops.test_keep_alive import ROOT, _free_port, heartbeat_connection
from tests.live import database_url

HEAD_SECONDS = 2
HEAD_MAX_BYTES = 8192
MAX_CONNECTIONS = 40


@pytest.fixture
def web(settings):
    """bin/web with one worker and short head bounds; its port."""
    port = _free_port()
    env = {**os.environ, "PORT": str(port), "WEB_WORKERS": "1", "DATABASE_URL": database_url(),
           "REDIS_URL": settings.REDIS_URL, "REQUEST_HEAD_SECONDS": str(HEAD_SECONDS),
           "REQUEST_HEAD_MAX_BYTES": str(HEAD_MAX_BYTES),
           "WEB_MAX_CONNECTIONS": str(MAX_CONNECTIONS)}  # fmt: skip
    server = subprocess.Popen([str(ROOT / "bin" / "web")], env=env, cwd=ROOT, start_new_session=True)
    try:
        heartbeat_connection(port).close()
        yield port
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)


def _connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=HEAD_SECONDS + 10)


def _answer(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """The status, headers and body of the one answer before the server closes the connection."""
    raw = b""
    while chunk := sock.recv(65536):
        raw += chunk
    head, _, body = raw.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.lower().split(": ", 1) for line in header_lines)
    return int(status_line.split()[1]), headers, body


def _heartbeat_answers(port: int) -> bool:
    with _connect(port) as sock:
        sock.sendall(b"GET /api/v2/status/heartbeat HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        return _answer(sock)[0] == 200


def _kept_alive_answer(sock: socket.socket) -> int:
    """The status of one answer read to its content-length's end, the connection left open."""
    raw = b""
    while b"\r\n\r\n" not in raw:
        raw += sock.recv(65536)
    head, _, body = raw.partition(b"\r\n\r\n")
    length = int(
        next(line for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:"))[15:]
    )
    while len(body) < length:
        body += sock.recv(65536)
    return int(head.split()[1])


@pytest.mark.django_db(transaction=True)
def test_a_head_sent_a_byte_at_a_time_is_408_and_closed_when_its_time_is_up(web):
    started = time.monotonic()
    socks = [_connect(web) for _ in range(10)]
    try:
        for sock in socks:
            sock.sendall(b"GET /api/v2/status/heartbeat HTTP/1.1\r\nX-Slow: ")
        # A byte every half second: each arrives well within any idle timeout, none ends the head.
        while time.monotonic() - started < HEAD_SECONDS + 1:
            for sock in socks:
                try:
                    sock.sendall(b"a")
                except OSError:
                    pass
            time.sleep(0.5)
        for sock in socks:
            status, headers, body = _answer(sock)
            assert (status, json.loads(body)["rc"]) == (408, "RequestTimeout")
            assert headers["connection"] == "close"
        assert time.monotonic() - started < HEAD_SECONDS + 5
        assert _heartbeat_answers(web)  # the server serves on
    finally:
        for sock in socks:
            sock.close()


@pytest.mark.django_db(transaction=True)
def test_a_connection_that_sends_nothing_is_closed_when_its_heads_time_is_up(web):
    with _connect(web) as sock:
        started = time.monotonic()
        status, _, body = _answer(sock)
        assert (status, json.loads(body)["rc"]) == (408, "RequestTimeout")
        assert HEAD_SECONDS - 0.5 < time.monotonic() - started < HEAD_SECONDS + 3


@pytest.mark.django_db(transaction=True)
def test_a_huge_head_is_431_and_closed_before_it_is_all_read(web):
    with _connect(web) as sock:
        sock.sendall(b"GET /api/v2/status/heartbeat HTTP/1.1\r\nX-Huge: ")
        sent = 0
        try:
            while sent < 50 * 1024 * 1024:
                sock.sendall(b"a" * 65536)
                sent += 65536
        except OSError:
            pass  # the server closed it
        assert sent < 5 * 1024 * 1024, sent
        status, _, body = _answer(sock)
        assert (status, json.loads(body)["rc"]) == (431, "RequestHeaderFieldsTooLarge")
    assert _heartbeat_answers(web)


@pytest.mark.django_db(transaction=True)
def test_a_head_over_the_bound_on_a_v1_path_answers_in_the_protocols_shape(web):
    with _connect(web) as sock:
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n" + b"X-Big: " + b"b" * HEAD_MAX_BYTES
        )
        status, _, body = _answer(sock)
    assert status == 431
    assert json.loads(body)["error"]["message"]


@pytest.mark.django_db(transaction=True)
def test_a_head_within_its_bounds_is_served_over_a_kept_alive_connection(web):
    connection = http.client.HTTPConnection("127.0.0.1", web, timeout=HEAD_SECONDS + 10)
    try:
        for _ in range(2):
            connection.request(
                "GET", "/api/v2/status/heartbeat", headers={"X-Fits": "f" * (HEAD_MAX_BYTES - 200)}
            )
            answer = connection.getresponse()
            assert answer.status == 200 and answer.read()
            local = connection.sock.getsockname()
            time.sleep(HEAD_SECONDS + 0.5)  # idle between requests: the keep-alive's time, not a head's
        assert connection.sock.getsockname() == local  # the same connection served both
    finally:
        connection.close()


@pytest.mark.django_db(transaction=True)
def test_connections_past_the_processs_bound_are_503_and_closed(web):
    held = [_connect(web) for _ in range(MAX_CONNECTIONS)]
    try:
        time.sleep(0.5)
        with _connect(web) as extra:
            status, headers, body = _answer(extra)
        assert (status, json.loads(body)["rc"], headers["retry-after"]) == (503, "ServiceUnavailable", "1")
    finally:
        for sock in held:
            sock.close()
    time.sleep(0.5)
    assert _heartbeat_answers(web)


@pytest.mark.django_db(transaction=True)
def test_a_kept_alive_connection_that_trickles_blank_lines_is_408_and_closed_when_its_heads_time_is_up(web):
    with _connect(web) as sock:
        sock.sendall(b"GET /api/v2/status/heartbeat HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        assert _kept_alive_answer(sock) == 200
        started, answered_after = time.monotonic(), None
        # The parser skips blank lines between requests, and each one cancels uvicorn's keep-alive
        # timer: without a head timer such a connection is held for ever.
        while answered_after is None and time.monotonic() - started < HEAD_SECONDS + 4:
            try:
                sock.sendall(b"\r\n")
            except OSError:
                pass  # the server closed it; its answer is read below
            if select.select([sock], [], [], 0.3)[0]:
                answered_after = time.monotonic() - started
        assert answered_after is not None, "the connection is still open"
        assert answered_after < HEAD_SECONDS + 1.5
        status, headers, body = _answer(sock)
        assert (status, json.loads(body)["rc"], headers["connection"]) == (408, "RequestTimeout", "close")


@pytest.mark.django_db(transaction=True)
def test_a_head_over_the_bound_sent_in_one_write_is_431_and_closed(web):
    with _connect(web) as sock:
        sock.sendall(
            b"GET /api/v2/status/heartbeat HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nX-Long: "
            + b"l" * (40 * 1024)
            + b"\r\n\r\n"
        )
        status, headers, body = _answer(sock)
    assert status == 431
    assert (json.loads(body)["rc"], headers["connection"]) == ("RequestHeaderFieldsTooLarge", "close")
    assert _heartbeat_answers(web)


@pytest.mark.django_db(transaction=True)
def test_heads_that_each_fit_sent_together_in_one_write_larger_than_the_bound_are_all_served(web):
    def head(close: bytes) -> bytes:
        fits = b"X-Fits: " + b"f" * (HEAD_MAX_BYTES // 2)
        return b"GET /api/v2/status/heartbeat HTTP/1.1\r\nHost: 127.0.0.1\r\n" + fits + close + b"\r\n\r\n"

    with _connect(web) as sock:
        sock.sendall(head(b"") + head(b"") + head(b"\r\nConnection: close"))
        raw = b""
        while chunk := sock.recv(65536):
            raw += chunk
    assert raw.count(b"HTTP/1.1 200 OK\r\n") == 3, raw[:300]
