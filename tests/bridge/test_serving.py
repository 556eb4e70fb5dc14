"""The bridge serves the stack's requesters from a real engine: the OpenAI, Anthropic and horde
routes get the engine's own reply (greedy sampling makes it repeatable, so the reply through the
horde is compared with the same request sent to the engine directly), streamed in pieces."""

import json
import time

import httpx
import pytest

from tests.bridge.conftest import MODEL

pytestmark = pytest.mark.timeout(240)
PROMPT_MARKER = "prompt-marker-no-log-may-carry"
MESSAGES = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": f"Say hello. {PROMPT_MARKER}"},
]


@pytest.fixture(scope="module")
def accounts(stack):
    return {"owner": stack.create_account("bridge-owner"), "requester": stack.create_account("requester")}


@pytest.fixture
def bridge(stack, engine, accounts, run_bridge):
    started = run_bridge(
        "--horde_url", stack.url, f"--api_key={accounts['owner']}", "--worker_name", "tiny-bridge",
        "--backend_url", engine.url, "--model", MODEL,
    )  # fmt: skip
    started.wait_for(r"serving .* as tiny-bridge")
    # The first pop checks the worker in; then the model is known to requesters.
    _until(lambda: httpx.get(f"{stack.url}/api/v2/workers/name/tiny-bridge").status_code == 200)
    return started


def _until(check, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def _direct_chat(engine, max_tokens: int) -> str:
    body = {"messages": MESSAGES, "max_tokens": max_tokens, "temperature": 0}
    answer = httpx.post(f"{engine.url}/v1/chat/completions", json=body, timeout=60).json()
    return answer["choices"][0]["message"]["content"]


def _events(response: httpx.Response) -> list[dict]:
    return [json.loads(line[6:]) for line in response.iter_lines() if line.startswith("data: {")]


def test_a_streamed_chat_completion_is_the_engines_reply_in_pieces(stack, engine, accounts, bridge) -> None:
    expected = _direct_chat(engine, 96)
    body = {"model": MODEL, "messages": MESSAGES, "max_tokens": 96, "temperature": 0, "stream": True}
    headers = {"Authorization": f"Bearer {accounts['requester']}"}
    with httpx.stream(
        "POST", f"{stack.url}/v1/chat/completions", json=body, headers=headers, timeout=60
    ) as r:
        assert r.status_code == 200, r.read()
        chunks = _events(r)
    pieces = [c["choices"][0]["delta"].get("content") for c in chunks if c["choices"]]
    pieces = [piece for piece in pieces if piece]
    assert "".join(pieces) == expected
    assert len(pieces) >= 3, pieces
    finish = [
        c["choices"][0]["finish_reason"] for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]
    ]
    assert finish == ["length"]
    line = bridge.wait_for(r"job \S+ \(chat, hordeops-tiny\): submitted, (\d+) tokens")
    assert int(line[1]) == 96
    assert PROMPT_MARKER not in bridge.output() and expected[:20] not in bridge.output()
