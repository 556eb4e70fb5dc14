"""What ends a job ends the engine's generation, seen from the engine's side: its log says its
client left and its CPU time stops growing. A reply longer than the base lease lives on its
progress posts; SIGTERM finishes a job or gives it back, never strands it; a backend that dies
gives its job back at once."""

import json
import signal
import threading
import time

import httpx
import pytest

from tests.bridge.conftest import (
    MODEL,
    STACK_SETTINGS,
    engine_stopped,
    first_content,
    sse_data,
    start_bridge,
)
from tests.bridge.engine import Engine

pytestmark = pytest.mark.timeout(240)
LEASE_SECONDS = int(STACK_SETTINGS["TEXT_JOB_LEASE_SECONDS"])
# About 8 s of generation on one core: longer than the base lease, and still running when a
# test stops it.
LONG_REPLY_TOKENS = 1700
MESSAGES = [{"role": "user", "content": "Tell me a long story."}]
# Served under names of their own (`--model`), by the tests whose bridge must get the job.
FRAGILE = "openai/hordeops-fragile"
RESTING = "openai/hordeops-resting"
IMPATIENT = "openai/hordeops-impatient"
LEAVING = "openai/hordeops-leaving"


def _chat(stack, key: str, max_tokens: int, model: str = MODEL, **headers: str):
    body = {"model": model, "messages": MESSAGES, "max_tokens": max_tokens, "temperature": 0, "stream": True}
    return httpx.stream(
        "POST",
        f"{stack.url}/v1/chat/completions",
        json=body,
        headers={"Authorization": f"Bearer {key}", **headers},
        timeout=60,
    )


def _generation(stack, generation_id: str) -> tuple[str, int]:
    return stack.sql("SELECT state, renewals FROM jobs_generation WHERE id = %s", (generation_id,))[0]


def _last_generation(stack) -> str:
    return str(stack.sql("SELECT id FROM jobs_generation ORDER BY popped_at DESC LIMIT 1")[0][0])


def _contents(stream: str) -> list[str]:
    """The text pieces of an event stream's chunks."""
    chunks = [json.loads(line[6:]) for line in stream.splitlines() if line.startswith("data: {")]
    return [d for c in chunks if c.get("choices") and (d := c["choices"][0].get("delta", {}).get("content"))]


def _given_back(stack, engine, worker, *, stopped: float, stream_rest: str, disconnects: int) -> None:
    """A stopped bridge gave its job back: the requester's stream ended with an error within
    3 s of `stopped`, the bridge exited cleanly, the generation is faulted, the engine stopped."""
    assert time.monotonic() - stopped < 3 and '"error"' in stream_rest
    assert worker.process.wait(timeout=30) == 0
    assert _generation(stack, _last_generation(stack))[0] == "faulted"
    engine_stopped(engine, disconnects)


def test_a_reply_longer_than_the_base_lease_lives_on_its_progress_posts(stack, engine, accounts, bridge):
    started = time.monotonic()
    with _chat(stack, accounts["requester"], LONG_REPLY_TOKENS) as response:
        assert response.status_code == 200
        chunks = sse_data(response)
    took = time.monotonic() - started
    # The stale pass runs every second: without renewals the job would have been taken back.
    assert took > LEASE_SECONDS + 2, took
    finish = [
        c["choices"][0]["finish_reason"] for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]
    ]
    assert finish == ["length"]
    state, renewals = _generation(stack, _last_generation(stack))
    assert state == "done" and renewals >= 2
    line = bridge.wait_for(r"submitted, (\d+) tokens .*, lease (\w+)")
    assert int(line[1]) == LONG_REPLY_TOKENS and line[2] == "granted"


def test_a_requester_that_leaves_stops_the_engine(stack, engine, accounts, bridge) -> None:
    disconnects = engine.disconnects()
    with _chat(stack, accounts["requester"], LONG_REPLY_TOKENS) as response:
        first_content(response.iter_lines())
    left = time.monotonic()
    engine_stopped(engine, disconnects)
    assert time.monotonic() - left < 3
    bridge.wait_for(r"job \S+ \(chat, .*\): lost, .*GenerationCancelled")


def test_a_deadline_ends_the_stream_with_an_error_and_stops_the_engine(
    stack, engine, accounts, bridge
) -> None:
    disconnects = engine.disconnects()
    started = time.monotonic()
    with _chat(
        stack, accounts["requester"], LONG_REPLY_TOKENS, **{"X-MultiLLM-Deadline-Ms": "2000"}
    ) as response:
        assert response.status_code == 200
        text = response.read().decode()
    assert time.monotonic() - started < 4
    assert '"error"' in text and "[DONE]" not in text.split('"error"')[0][-20:]
    engine_stopped(engine, disconnects)
    bridge.wait_for(r"job \S+ \(chat, .*\): (lost|deadline)")


def test_a_delete_of_the_request_stops_the_engine(stack, engine, accounts, bridge) -> None:
    disconnects = engine.disconnects()
    with _chat(stack, accounts["requester"], LONG_REPLY_TOKENS) as response:
        lines = response.iter_lines()
        request_id = first_content(lines)["id"].removeprefix("chatcmpl-")
        deleted = httpx.delete(f"{stack.url}/api/v2/generate/text/status/{request_id}")
        assert deleted.status_code == 200, deleted.text
        rest = "\n".join(lines)
    assert '"error"' in rest
    engine_stopped(engine, disconnects)
    bridge.wait_for(r"job \S+ \(chat, .*\): lost, .*GenerationCancelled")


def test_sigterm_lets_a_running_job_finish_within_the_grace_period(
    stack, engine, accounts, run_bridge
) -> None:
    worker = start_bridge(
        stack, engine, accounts["owner"], run_bridge, "graceful-bridge", "--grace_seconds", "30"
    )
    with _chat(stack, accounts["requester"], 600) as response:
        lines = response.iter_lines()
        first_content(lines)
        worker.process.send_signal(signal.SIGTERM)
        rest = "\n".join(lines)
    assert '"finish_reason":"length"' in rest and "[DONE]" in rest
    assert worker.process.wait(timeout=30) == 0
    output = worker.output()
    assert "no more pops; 1 running jobs may finish" in output and "submitted, 600 tokens" in output


def test_sigterm_past_the_grace_period_gives_the_job_back(stack, engine, accounts, run_bridge) -> None:
    worker = start_bridge(
        stack, engine, accounts["owner"], run_bridge, "hasty-bridge", "--grace_seconds", "0.5"
    )
    disconnects = engine.disconnects()
    with _chat(stack, accounts["requester"], LONG_REPLY_TOKENS) as response:
        lines = response.iter_lines()
        first_content(lines)
        worker.process.send_signal(signal.SIGTERM)
        stopped = time.monotonic()
        rest = "\n".join(lines)
    # Ended at the give-back, not at the lease's end plus a stale pass.
    _given_back(stack, engine, worker, stopped=stopped, stream_rest=rest, disconnects=disconnects)
    assert "given back" in worker.output()


def test_a_second_interrupt_gives_the_job_back_at_once(stack, engine, accounts, run_bridge) -> None:
    worker = start_bridge(
        stack, engine, accounts["owner"], run_bridge, "impatient-bridge", "--model", IMPATIENT
    )  # fmt: skip
    disconnects = engine.disconnects()
    with _chat(stack, accounts["requester"], LONG_REPLY_TOKENS, IMPATIENT) as response:
        lines = response.iter_lines()
        # Two posts' text: the second is sent once the first is answered, so one post is counted
        # (the first text alone may reach the requester before its post's answer reaches the bridge).
        first_content(lines)
        first_content(lines)
        worker.process.send_signal(signal.SIGINT)
        worker.wait_for(r"no more pops; 1 running jobs may finish")
        worker.process.send_signal(signal.SIGINT)
        stopped = time.monotonic()
        rest = "\n".join(lines)
    # The default grace period is 30 s: the job came back at the second Ctrl-C, not at its end.
    _given_back(stack, engine, worker, stopped=stopped, stream_rest=rest, disconnects=disconnects)
    assert "second interrupt: giving back 1 running jobs now" in worker.output()
    # The log line counts what the job did before it was given back, not a fresh job's zeros.
    streamed = 2 + len(_contents(rest))
    line = worker.wait_for(r"given back, (\d+) tokens .*, (\d+) progress posts, lease \w+; stopped")
    tokens, posts = int(line[1]), int(line[2])
    assert tokens >= streamed and posts >= 1, (streamed, line[0])


def test_a_backend_that_dies_gives_its_job_back_and_is_waited_for(stack, model_file, accounts, run_bridge):
    dying = Engine(model_file).start()
    try:
        # A model name of its own: the module's other bridges, killed at their tests' ends
        # without a goodbye, online for a while and measured faster, would be the ones
        # offered its short chats (the speed gate).
        worker = start_bridge(
            stack, dying, accounts["owner"], run_bridge, "fragile-bridge", "--model", FRAGILE
        )  # fmt: skip
        with _chat(stack, accounts["requester"], LONG_REPLY_TOKENS, FRAGILE) as response:
            lines = response.iter_lines()
            first_content(lines)
            dying.process.kill()
            died = time.monotonic()
            rest = "\n".join(lines)
        assert time.monotonic() - died < 3 and '"error"' in rest
        assert _generation(stack, _last_generation(stack))[0] == "faulted"
        worker.wait_for(r"given back, .*; backend failed")
        # Back on its address, the engine serves the next request.
        dying.start(port=dying.port)
        served = threading.Event()

        def request() -> None:
            with _chat(stack, accounts["requester"], 32, FRAGILE) as again:
                if '"finish_reason":"length"' in again.read().decode():
                    served.set()

        thread = threading.Thread(target=request)
        thread.start()
        thread.join(timeout=60)
        assert served.is_set(), worker.output()
        worker.wait_for(r"the backend answers again; popping")
    finally:
        dying.stop()


def test_maintenance_is_waited_out(stack, engine, accounts, run_bridge) -> None:
    worker = start_bridge(
        stack, engine, accounts["owner"], run_bridge, "resting-bridge", "--maintenance_wait", "0.5",
        "--model", RESTING,
    )  # fmt: skip
    stack.sql("UPDATE workers_worker SET maintenance = true WHERE name = 'resting-bridge'")
    worker.wait_for(r"in maintenance")
    stack.sql("UPDATE workers_worker SET maintenance = false WHERE name = 'resting-bridge'")
    with _chat(stack, accounts["requester"], 32, RESTING) as response:
        assert '"finish_reason":"length"' in response.read().decode()
    worker.wait_for(r"job \S+ \(chat, .*\): submitted, 32 tokens")


def test_a_bridge_stopped_by_sigterm_is_offline_at_once(stack, engine, accounts, run_bridge) -> None:
    worker = start_bridge(
        stack, engine, accounts["owner"], run_bridge, "leaving-bridge", "--model", LEAVING
    )  # fmt: skip
    requester = {"Authorization": f"Bearer {accounts['requester']}"}
    listed = httpx.get(f"{stack.url}/v1/models", headers=requester).json()["data"]
    assert LEAVING in [m["id"] for m in listed]

    assert worker.stop(signal.SIGTERM) == 0
    worker.wait_for(r"said goodbye: leaving-bridge is offline until it pops again")

    # At once, not WORKER_ONLINE_SECONDS (300 s) after its last pop.
    details = httpx.get(f"{stack.url}/api/v2/workers/name/leaving-bridge").json()
    assert details["online"] is False
    listed = httpx.get(f"{stack.url}/v1/models", headers=requester).json()["data"]
    assert LEAVING not in [m["id"] for m in listed]
    body = {"model": LEAVING, "messages": MESSAGES, "max_tokens": 16}
    refused = httpx.post(f"{stack.url}/v1/chat/completions", json=body, headers=requester)
    assert refused.status_code == 404 and refused.json()["error"]["code"] == "model_not_found"
    online = httpx.get(f"{stack.url}/api/v2/workers", params={"name": "leaving-bridge"}).json()
    assert online == []
