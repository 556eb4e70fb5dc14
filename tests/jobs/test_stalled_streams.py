"""A chat stream whose requester stops reading ends, and its request is cancelled.

A real uvicorn process streams to a raw socket that never reads: its receive buffer and its
segment size are made tiny before it connects, so that the server's socket fills after about
100 KB, as it would for a reader on a slow or stuck link. The worker keeps posting deltas.
"""

import json
import socket
import time

import httpx
import pytest

from jobs.models import Ending, Generation, TextRequest
from tests.live import ChatWorker

MODEL = "koboldcpp/stalled-test-8B"
SEND_TIMEOUT_SECONDS = 2
QUEUE_MAX_BYTES = 65536
# 100 UTF-8 bytes a delta, 300 once JSON-escaped: the server's buffers fill within the request's
# output bound (max_tokens x 16 bytes).
DELTA = "🦄" * 25
MARGIN_SECONDS = 10


def _stalled_requester(url: str, api_key: str) -> socket.socket:
    """A streamed chat request sent on a socket that will never be read."""
    address = httpx.URL(url)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    # A small segment size keeps the server's send buffer small (Linux sizes it by segments).
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG, 536)
    sock.connect((address.host, address.port))
    body = json.dumps(
        {
            "model": MODEL,
            "messages": [{"role": "user", "content": "Hi."}],
            "stream": True,
            "max_tokens": 16000,
        }
    ).encode()
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: {address.host}\r\n"
        f"Authorization: Bearer {api_key}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    sock.sendall(head.encode() + body)
    return sock


@pytest.mark.parametrize("live_stack", [1], indirect=True)
@pytest.mark.live_env(
    STREAM_SEND_TIMEOUT_SECONDS=str(SEND_TIMEOUT_SECONDS), STREAM_QUEUE_MAX_BYTES=str(QUEUE_MAX_BYTES)
)
def test_a_stream_whose_requester_never_reads_is_cancelled_and_its_worker_told(live_stack, make_caller):
    (url,) = live_stack.urls
    requester, owner = make_caller("stalled-requester"), make_caller("stalled-owner")
    worker = ChatWorker(url, owner.api_key, name="stalled-worker", model=MODEL)
    worker.pop()
    sock = _stalled_requester(url, requester.api_key)
    try:
        worker.pop_job()
        started = time.monotonic()
        posted = 0
        while time.monotonic() - started < SEND_TIMEOUT_SECONDS + MARGIN_SECONDS:
            answer = worker.progress(DELTA)
            if answer.status_code != 200:
                break
            posted += 1
        elapsed = time.monotonic() - started
        assert answer.status_code == 409 and answer.json()["rc"] == "GenerationCancelled", (
            f"{posted} deltas in {elapsed:.1f} s, then {answer.status_code} {answer.text}"
        )
        text_request = Generation.objects.get(pk=worker.id).request
        assert text_request.state == TextRequest.State.CANCELLED
        assert text_request.ending == Ending.CANCELLED
        server = live_stack.servers[0]
        server.log.flush()
        server.log.seek(0)
        output = server.log.read()  # all of it: output() keeps only its tail
        # Whichever comes first ends it: the queue's bound (memory) or the send's timeout.
        stalled = "bytes queued for a requester that does not read" in output
        timed_out = f"took none of it for {float(SEND_TIMEOUT_SECONDS)} s" in output
        assert stalled or timed_out, output[-3000:]
    finally:
        sock.close()
        worker.close()
    live_stack.assert_alive()
