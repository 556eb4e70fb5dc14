"""A web process restarted under an open stream: its request is cancelled and not charged, and
the bridge stops generating. The web process is `bin/stack`'s gunicorn worker, as in production;
gunicorn starts another in its place, as after a deploy's SIGTERM or a crash's SIGKILL."""

import os
import signal
import time
from pathlib import Path

import httpx
import pytest

from tests.bridge.conftest import MODEL, engine_stopped, first_content, until

pytestmark = pytest.mark.timeout(240)
LONG_REPLY_TOKENS = 1700
MESSAGES = [{"role": "user", "content": "Tell me a long story."}]


def _parent(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("PPid:"):
            return int(line.split()[1])
    return 0


def _command(pid: int) -> str:
    return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")


def web_process(stack) -> int:
    """The stack's one gunicorn worker: a gunicorn process whose parent is gunicorn, among the
    processes the stack started (nothing else on the machine is looked at twice)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            pid, ancestors = int(entry.name), []
            parent = _parent(pid)
            while parent > 1:
                ancestors.append(parent)
                parent = _parent(parent)
            if (
                stack.process.pid in ancestors
                and "gunicorn" in _command(pid)
                and "gunicorn" in _command(_parent(pid))
            ):
                found.append(pid)
        except (FileNotFoundError, ProcessLookupError):
            continue
    assert len(found) == 1, found
    return found[0]


def _request(stack, request_id: str) -> tuple[str, str, float]:
    return stack.sql("SELECT state, ending, kudos_spent FROM jobs_textrequest WHERE id = %s", (request_id,))[
        0
    ]


def _replaced(stack, old: int) -> None:
    """Gunicorn runs a new web process in the old one's place, and it answers."""

    def answers() -> bool:
        try:
            return httpx.get(f"{stack.url}/api/v2/status/heartbeat", timeout=2).status_code == 200
        except httpx.TransportError:
            return False

    until(answers, timeout=60, message="no web process answers")
    assert web_process(stack) != old


def _stream(stack, key: str):
    body = {"model": MODEL, "messages": MESSAGES, "max_tokens": LONG_REPLY_TOKENS, "stream": True}
    return httpx.stream(
        "POST", f"{stack.url}/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"},
        timeout=60,
    )  # fmt: skip


def test_a_stopped_web_process_ends_its_streams_with_an_error_and_charges_nothing(
    stack, engine, accounts, bridge
) -> None:
    disconnects = engine.disconnects()
    old = web_process(stack)
    with _stream(stack, accounts["requester"]) as response:
        lines = response.iter_lines()
        request_id = first_content(lines)["id"].removeprefix("chatcmpl-")
        os.kill(old, signal.SIGTERM)
        stopped = time.monotonic()
        rest = "\n".join(lines)
    assert time.monotonic() - stopped < 5
    assert '"error"' in rest and "restarting" in rest and "[DONE]" not in rest
    assert _request(stack, request_id) == ("cancelled", "ServiceUnavailable", 0)
    engine_stopped(engine, disconnects)
    bridge.wait_for(r"job \S+ \(chat, .*\): lost, .*GenerationCancelled")
    _replaced(stack, old)
    assert "submitted" not in bridge.output()


def test_a_killed_web_process_has_its_streams_requests_cancelled_within_seconds(
    stack, engine, accounts, bridge
) -> None:
    disconnects = engine.disconnects()
    old = web_process(stack)
    with pytest.raises(httpx.TransportError):
        with _stream(stack, accounts["requester"]) as response:
            lines = response.iter_lines()
            request_id = first_content(lines)["id"].removeprefix("chatcmpl-")
            os.kill(old, signal.SIGKILL)
            killed = time.monotonic()
            "\n".join(lines)
    # The bridge's next progress post, to the web process that replaced it, finds the follower gone.
    bridge.wait_for(r"job \S+ \(chat, .*\): lost, .*GenerationCancelled", timeout=30)
    assert time.monotonic() - killed < 20
    assert _request(stack, request_id) == ("cancelled", "ServiceUnavailable", 0)
    engine_stopped(engine, disconnects)
    _replaced(stack, old)
    assert "submitted" not in bridge.output()
