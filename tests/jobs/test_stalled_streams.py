"""A chat stream whose requester stops reading ends, and its request is cancelled.

A real uvicorn process streams to a raw socket that never reads: its receive buffer and its
segment size are made tiny before it connects, so that the server's socket fills after about
100 KB (Linux sizes a send buffer by segments), as it would for a reader on a stuck link.
The worker keeps posting deltas until it is told GenerationCancelled.
"""

import json
import socket
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from jobs.models import Ending, Generation, TextRequest
from tests.live import ChatWorker, LiveStack

MODEL = "koboldcpp/stalled-test-8B"
# 100 UTF-8 bytes a delta, 300 once JSON-escaped: the server's buffers fill well within the
# request's output bound (16,000 tokens x 16 bytes).
DELTA = "🦄" * 25
SHORT_TIMEOUT_SECONDS = 2
SMALL_QUEUE_BYTES = 65536
MARGIN_SECONDS = 10
TIMED_OUT = "a stream's requester took none of it for"
QUEUE_FULL = "bytes queued for a requester that does not read"


@dataclass
class Stalled:
    answer: httpx.Response
    posted: int
    seconds: float
    text_request: TextRequest
    log: str
    server_holds_connection: bool


def _stalled_requester(url: str, api_key: str) -> socket.socket:
    """A streamed chat request sent on a socket that will never be read."""
    address = httpx.URL(url)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG, 536)
    sock.connect((address.host, address.port))
    call = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Hi."}],
        "stream": True,
        "max_tokens": 16000,
    }
    body = json.dumps(call).encode()
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: {address.host}\r\n"
        f"Authorization: Bearer {api_key}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    sock.sendall(head.encode() + body)
    return sock


def _stream_to_a_requester_that_never_reads(live_stack: LiveStack, make_caller, within: float) -> Stalled:
    """Post deltas until the worker is told something other than 200, or `within` seconds pass."""
    (url,) = live_stack.urls
    requester, owner = make_caller("stalled-requester"), make_caller("stalled-owner")
    worker = ChatWorker(url, owner.api_key, name="stalled-worker", model=MODEL)
    worker.pop()
    sock = _stalled_requester(url, requester.api_key)
    try:
        worker.pop_job()
        started = time.monotonic()
        posted = 0
        while time.monotonic() - started < within:
            answer = worker.progress(DELTA)
            if answer.status_code != 200:
                break
            posted += 1
        seconds = time.monotonic() - started
        text_request = Generation.objects.get(pk=worker.id).request
        holds = _server_holds(httpx.URL(url).port, sock.getsockname()[1])
    finally:
        sock.close()
        worker.close()
    server = live_stack.servers[0]
    server.log.flush()
    server.log.seek(0)
    # All of it: output() keeps only its tail, and every progress post logs a line.
    return Stalled(answer, posted, seconds, text_request, server.log.read(), holds)


def _server_holds(server_port: int, client_port: int) -> bool:
    """Whether the server's end of this loopback connection is still open (FIN_WAIT1 included:
    a closed socket with unsent bytes is kept by the kernel while the peer's window is shut)."""
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        local, remote = line.split()[1:3]
        if int(local.split(":")[1], 16) == server_port and int(remote.split(":")[1], 16) == client_port:
            return True
    return False


def _assert_cancelled_and_worker_told(stalled: Stalled) -> None:
    answer = stalled.answer
    assert answer.status_code == 409 and answer.json()["rc"] == "GenerationCancelled", (
        f"{stalled.posted} deltas in {stalled.seconds:.1f} s, then {answer.status_code} {answer.text}"
    )
    stalled.text_request.refresh_from_db()
    assert stalled.text_request.state == TextRequest.State.CANCELLED
    assert stalled.text_request.ending == Ending.CANCELLED  # the requester's side: it stopped reading
    assert not stalled.server_holds_connection  # reset, not closed behind its unread bytes


@pytest.mark.parametrize("live_stack", [1], indirect=True)
@pytest.mark.live_env(
    STREAM_SEND_TIMEOUT_SECONDS=str(SHORT_TIMEOUT_SECONDS), STREAM_QUEUE_MAX_BYTES=str(1024 * 1024 * 1024)
)
def test_a_stream_whose_requester_takes_nothing_for_the_send_timeout_is_cancelled(live_stack, make_caller):
    stalled = _stream_to_a_requester_that_never_reads(
        live_stack, make_caller, within=SHORT_TIMEOUT_SECONDS + MARGIN_SECONDS
    )
    _assert_cancelled_and_worker_told(stalled)
    assert TIMED_OUT in stalled.log and QUEUE_FULL not in stalled.log, stalled.log[-3000:]
    live_stack.assert_alive()


@pytest.mark.parametrize("live_stack", [1], indirect=True)
@pytest.mark.live_env(STREAM_SEND_TIMEOUT_SECONDS="600", STREAM_QUEUE_MAX_BYTES=str(SMALL_QUEUE_BYTES))
def test_a_stream_whose_queue_passes_its_bound_is_cancelled_long_before_the_send_timeout(
    live_stack, make_caller
):
    stalled = _stream_to_a_requester_that_never_reads(live_stack, make_caller, within=MARGIN_SECONDS)
    _assert_cancelled_and_worker_told(stalled)
    assert QUEUE_FULL in stalled.log and TIMED_OUT not in stalled.log, stalled.log[-3000:]
    # What the web process held for it: no more than the bound and one event.
    (line,) = [line for line in stalled.log.splitlines() if QUEUE_FULL in line]
    held = int(line.split(": ")[-1].split()[0])
    assert SMALL_QUEUE_BYTES < held <= SMALL_QUEUE_BYTES + 2048, line
    live_stack.assert_alive()
