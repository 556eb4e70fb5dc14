"""Bodies are limited while they are read (hordeops.asgi): 413 past 1 MiB, 408 when they stall."""

import asyncio
import json
import socket
import time

import pytest

from hordeops import asgi

CHUNK = 64 * 1024


def _post(path: str, body_chunks, *, content_length: int | None = None) -> tuple[int, dict, dict, int]:
    """POST through the ASGI app; `body_chunks` yields chunks (None: wait that long, in seconds).

    Returns the status, the headers, the JSON body and how many body bytes the app took.
    """
    headers = [(b"host", b"testserver"), (b"content-type", b"application/json")]
    if content_length is not None:
        headers.append((b"content-length", str(content_length).encode()))
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": headers,
        "client": ("127.0.0.1", 1234),
        "server": ("testserver", 80),
    }
    sent: list[dict] = []
    taken = 0
    chunks = iter(body_chunks)

    async def receive():
        nonlocal taken
        while True:
            chunk = next(chunks, b"")
            if isinstance(chunk, (int, float)):
                await asyncio.sleep(chunk)
                continue
            taken += len(chunk)
            return {"type": "http.request", "body": chunk, "more_body": bool(chunk)}

    async def send(message):
        sent.append(message)

    asyncio.run(asgi.application(scope, receive, send))
    start = next(m for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    answer_headers = {k.decode().lower(): v.decode() for k, v in start["headers"]}
    return start["status"], answer_headers, json.loads(body), taken


def _endless(chunk: bytes = b" " * CHUNK):
    """16 MiB of body, more than any route takes (and a bound, so that a failing test ends)."""
    for _ in range(256):
        yield chunk


@pytest.mark.parametrize(
    "path", ["/api/v2/generate/text/async", "/api/v2/generate/text/pop", "/admin/login/"]
)
def test_a_body_sent_without_length_is_refused_at_the_chunk_that_crosses_1_mib(path):
    status, headers, body, taken = _post(path, _endless())
    assert status == 413
    assert body == {"message": "The body is larger than 1 MiB.", "rc": "PayloadTooLarge"}
    assert 1024 * 1024 < taken <= 1024 * 1024 + CHUNK
    assert headers["connection"] == "close"


@pytest.mark.parametrize(
    ("path", "error"),
    [
        ("/v1/chat/completions", {"error": {"message": "The body is larger than 1 MiB.",
                                            "type": "invalid_request_error", "param": None,
                                            "code": "payload_too_large"}}),
        ("/v1/messages", {"type": "error", "error": {"type": "request_too_large",
                                                     "message": "The body is larger than 1 MiB."}}),
    ],
)  # fmt: skip
def test_a_chat_routes_oversized_body_is_refused_in_its_protocols_shape(path, error):
    status, _, body, taken = _post(path, _endless())
    assert (status, body) == (413, error)
    assert taken <= 1024 * 1024 + CHUNK


def test_a_larger_content_length_is_refused_before_any_of_the_body_is_read():
    status, _, body, taken = _post("/api/v2/generate/text/async", _endless(), content_length=2**30)
    assert status == 413 and body["rc"] == "PayloadTooLarge"
    assert taken == 0


@pytest.mark.django_db
def test_a_body_of_exactly_1_mib_is_read_and_answered_by_the_route():
    prompt = "x" * (1024 * 1024 - 200)
    raw = json.dumps({"prompt": prompt}).encode()
    raw += b" " * (1024 * 1024 - len(raw))
    status, _, body, taken = _post(
        "/api/v2/generate/text/async", [raw[i : i + CHUNK] for i in range(0, len(raw), CHUNK)]
    )
    assert taken == 1024 * 1024
    assert status == 401 and body["rc"] == "InvalidAPIKey"  # the route ran: no key was sent


def test_a_body_that_stops_arriving_is_a_408_after_the_stall_timeout(settings):
    settings.REQUEST_BODY_STALL_SECONDS = 1
    started = time.monotonic()
    status, headers, body, _ = _post("/api/v2/generate/text/async", [b'{"prompt": ', 60], content_length=100)
    assert 1 <= time.monotonic() - started < 3
    assert status == 408
    assert body == {"message": "The request body did not arrive in time.", "rc": "RequestTimeout"}
    assert headers["connection"] == "close"


def test_a_body_that_trickles_in_is_a_408_once_its_whole_time_is_spent(settings):
    settings.REQUEST_BODY_STALL_SECONDS = 1
    settings.REQUEST_BODY_SECONDS = 2
    started = time.monotonic()
    trickle = [b"{"] + [0.4, b" "] * 100
    status, _, body, taken = _post("/v1/chat/completions", trickle, content_length=1000)
    assert 2 <= time.monotonic() - started < 4
    assert status == 408 and body["error"]["code"] == "request_timeout"
    assert taken < 20


def _answer(sock: socket.socket, timeout: float) -> bytes:
    sock.settimeout(timeout)
    data = b""
    while b"\r\n0\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    return data


def test_over_real_http_a_stalled_body_frees_its_connection_after_the_default_stall_timeout(live_stack):
    port = int(live_stack.urls[0].rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(
            b"POST /api/v2/generate/text/async HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b'Content-Length: 100\r\n\r\n{"prompt": '
        )
        started = time.monotonic()
        answer = _answer(sock, 30)
        elapsed = time.monotonic() - started
        assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
        assert b"RequestTimeout" in answer
        assert 4.5 <= elapsed < 10, elapsed
        assert sock.recv(10) == b""  # closed by the server


def test_over_real_http_an_endless_body_is_answered_413_without_reading_it_all(live_stack):
    port = int(live_stack.urls[0].rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(
            b"POST /api/v2/generate/text/pop HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n"
        )
        chunk = b"%x\r\n%s\r\n" % (CHUNK, b" " * CHUNK)
        sent = 0
        sock.settimeout(0.05)
        answer = b""
        while sent < 64 * 1024 * 1024 and not answer:
            try:
                sock.sendall(chunk)
                sent += CHUNK
                answer = sock.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                break  # the server closed: its answer is in our receive buffer
        answer += _answer(sock, 10)
        assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
        assert sent < 8 * 1024 * 1024  # refused long before the end of what the client would send


def test_over_real_http_a_413_says_connection_close_once_even_when_the_client_did(live_stack):
    port = int(live_stack.urls[0].rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(
            b"POST /api/v2/generate/text/async HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Connection: close\r\nContent-Length: 2000000\r\n\r\n"
        )
        head = _answer(sock, 10).split(b"\r\n\r\n")[0].lower()
    assert head.startswith(b"http/1.1 413"), head
    assert head.count(b"connection: close") == 1, head
