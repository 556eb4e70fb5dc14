"""The bridge serves the stack's requesters from a real engine: the OpenAI, Anthropic and horde
routes get the engine's own reply (greedy sampling makes it repeatable, so the reply through the
horde is compared with the same request sent to the engine directly), streamed in pieces, with
the job's parameters applied by the engine."""

import httpx
import openai
import pytest

from tests.bridge.conftest import MODEL, sse_data, until

pytestmark = pytest.mark.timeout(240)
PROMPT_MARKER = "prompt-marker-no-log-may-carry"
SYSTEM = "Be brief."
USER = f"Say hello. {PROMPT_MARKER}"
MESSAGES = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": USER}]


def _direct(engine, path: str, **body) -> str:
    answer = httpx.post(f"{engine.url}{path}", json={"temperature": 0, **body}, timeout=60).json()
    choice = answer["choices"][0]
    return choice["message"]["content"] if "message" in choice else choice["text"]


def _tokens(engine, text: str) -> int:
    return len(httpx.post(f"{engine.url}/extras/tokenize", json={"input": text}).json()["tokens"])


def _no_text_in_log(bridge, *texts: str) -> None:
    output = bridge.output()
    for text in (PROMPT_MARKER, *texts):
        assert text[:24] not in output


def test_a_streamed_chat_completion_is_the_engines_reply_in_pieces(stack, engine, accounts, bridge) -> None:
    expected = _direct(engine, "/v1/chat/completions", messages=MESSAGES, max_tokens=96)
    body = {"model": MODEL, "messages": MESSAGES, "max_tokens": 96, "temperature": 0, "stream": True}
    headers = {"Authorization": f"Bearer {accounts['requester']}"}
    url = f"{stack.url}/v1/chat/completions"
    with httpx.stream("POST", url, json=body, headers=headers, timeout=60) as response:
        assert response.status_code == 200, response.read()
        chunks = sse_data(response)
    choices = [chunk["choices"][0] for chunk in chunks if chunk["choices"]]
    pieces = [choice["delta"]["content"] for choice in choices if choice["delta"].get("content")]
    assert "".join(pieces) == expected
    assert len(pieces) >= 3, pieces
    assert [choice["finish_reason"] for choice in choices if choice["finish_reason"]] == ["length"]
    line = bridge.wait_for(rf"job \S+ \(chat, {MODEL}\): submitted, (\d+) tokens")
    assert int(line[1]) == 96
    _no_text_in_log(bridge, expected)


def test_a_streamed_response_and_message_are_the_engines_reply(stack, engine, accounts, bridge) -> None:
    expected = _direct(engine, "/v1/chat/completions", messages=MESSAGES, max_tokens=64)
    key = accounts["requester"]
    body = {"model": MODEL, "instructions": SYSTEM, "input": USER, "max_output_tokens": 64, "temperature": 0}
    with httpx.stream(
        "POST", f"{stack.url}/v1/responses", json={**body, "stream": True},
        headers={"Authorization": f"Bearer {key}"}, timeout=60,
    ) as response:  # fmt: skip
        assert response.status_code == 200, response.read()
        events = sse_data(response)
    deltas = [event["delta"] for event in events if event["type"] == "response.output_text.delta"]
    assert "".join(deltas) == expected and len(deltas) >= 2

    body = {"model": MODEL, "system": SYSTEM, "messages": [{"role": "user", "content": USER}]}
    with httpx.stream(
        "POST", f"{stack.url}/v1/messages", json={**body, "max_tokens": 64, "temperature": 0, "stream": True},
        headers={"x-api-key": key, "anthropic-version": "2023-06-01"}, timeout=60,
    ) as response:  # fmt: skip
        assert response.status_code == 200, response.read()
        events = sse_data(response)
    deltas = [event["delta"]["text"] for event in events if event["type"] == "content_block_delta"]
    assert "".join(deltas) == expected and len(deltas) >= 2
    _no_text_in_log(bridge, expected)


def _horde_text(stack, key: str, prompt: str, **params) -> dict:
    """A horde text request, queued and waited for; its finished status."""
    headers = {"apikey": key}
    body = {"prompt": prompt, "params": params, "models": [MODEL]}
    queued = httpx.post(f"{stack.url}/api/v2/generate/text/async", json=body, headers=headers)
    assert queued.status_code == 202, queued.text
    url = f"{stack.url}/api/v2/generate/text/status/{queued.json()['id']}"
    status: dict = {}

    def done() -> bool:
        status.update(httpx.get(url).json())
        return bool(status.get("done") or status.get("faulted"))

    until(done, timeout=60)
    return status


def test_a_horde_text_request_is_served_whole_from_the_completions_route(stack, engine, accounts, bridge):
    prompt = f"Once upon a time {PROMPT_MARKER}"
    expected = _direct(engine, "/v1/completions", prompt=prompt, max_tokens=48)
    status = _horde_text(stack, accounts["requester"], prompt, max_length=48, temperature=0)
    assert status["done"] and status["generations"][0]["text"] == expected
    line = bridge.wait_for(rf"job \S+ \(text, {MODEL}\): submitted, (\d+) tokens[^,]*\)(.*)")
    assert int(line[1]) == 48 and "progress posts" not in line[2]  # a text job posts no progress
    _no_text_in_log(bridge, expected)


def test_a_streamed_text_completion_is_the_engines_completion_in_pieces(stack, engine, accounts, bridge):
    # Short: the job's context is the horde's estimate of the prompt (4 characters a token), and
    # this model's tokenizer counts more, so a longer prompt would be cut to fit it.
    prompt = "Once upon a time"
    expected = _direct(engine, "/v1/completions", prompt=prompt, max_tokens=64)
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 64, "temperature": 0, "stream": True}
    headers = {"Authorization": f"Bearer {accounts['requester']}"}
    with httpx.stream(
        "POST", f"{stack.url}/v1/completions", json=body, headers=headers, timeout=60
    ) as response:
        assert response.status_code == 200, response.read()
        chunks = sse_data(response)
    pieces = [chunk["choices"][0]["text"] for chunk in chunks if chunk["choices"][0]["text"]]
    assert "".join(pieces) == expected
    assert len(pieces) >= 3, pieces  # streamed by the bridge's progress posts, not whole at the end
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"][0]["finish_reason"]] == [
        "length"
    ]
    line = bridge.wait_for(
        rf"job \S+ \(text, {MODEL}\): submitted, (\d+) tokens[^,]*\), (\d+) progress posts"
    )
    assert int(line[1]) == 64 and int(line[2]) >= 2
    assert expected[:24] not in bridge.output()


def test_stop_sequences_reach_the_engine_exactly_as_sent(stack, engine, accounts, bridge) -> None:
    prompt = "The stop test"
    whole = _direct(engine, "/v1/completions", prompt=prompt, max_tokens=64)
    # A stop string that the greedy reply holds after its start: the reply ends just before it.
    stop = whole[20:24]
    assert stop.strip(), whole
    status = _horde_text(
        stack, accounts["requester"], prompt, max_length=64, temperature=0, stop_sequence=[stop]
    )
    assert status["generations"][0]["text"] == whole[: whole.index(stop)]


def test_a_seed_makes_sampled_replies_repeat_and_knobs_it_cannot_honour_are_logged_once(
    stack, engine, accounts, bridge
) -> None:
    prompt = "The seed test"
    params = {"max_length": 32, "temperature": 1.0, "top_k": 40, "tfs": 0.9}
    first = _horde_text(stack, accounts["requester"], prompt, sampler_seed=1234, **params)
    second = _horde_text(stack, accounts["requester"], prompt, sampler_seed=1234, **params)
    other = _horde_text(stack, accounts["requester"], prompt, sampler_seed=99, **params)
    texts = [status["generations"][0]["text"] for status in (first, second, other)]
    assert texts[0] == texts[1] != texts[2]
    assert bridge.output().count("cannot honour tfs") == 1


def test_a_prompt_longer_than_the_requesters_context_loses_its_start_and_says_so(
    stack, engine, accounts, bridge
) -> None:
    prompt = "Story. " + "word " * 200 + "The end is near"
    status = _horde_text(
        stack, accounts["requester"], prompt, max_length=32, max_context_length=160, temperature=0
    )
    # What was kept: the longest end of the prompt that leaves the reply its 32 tokens.
    kept = max(
        (prompt[-length:] for length in range(1, 160)),
        key=lambda end: len(end) if _tokens(engine, end) <= 160 - 32 else 0,
    )
    expected = _direct(engine, "/v1/completions", prompt=kept, max_tokens=32)
    assert status["generations"][0]["text"] == expected
    bridge.wait_for(r"did not fit its 160 tokens of context: trimmed the prompt's start to \d+ tokens")


def test_without_max_length_the_bridge_declares_a_1024_token_reply_and_the_openai_sdk_gets_it(
    stack, engine, accounts, run_bridge
) -> None:
    # llama-cpp-python's server says nothing of its limits: a model entry and no /props.
    [listed] = httpx.get(f"{engine.url}/v1/models").json()["data"]
    assert set(listed) == {"id", "object", "owned_by", "permissions"} and listed["owned_by"] == "me"
    assert httpx.get(f"{engine.url}/props").status_code == 404
    # A model name of its own: the module's other bridges declare other lengths for MODEL.
    name, model = "default-lengths", "openai/hordeops-defaults"
    bridge = run_bridge(
        "--horde_url", stack.url, f"--api_key={accounts['owner']}", "--worker_name", name,
        "--backend_url", engine.url, "--model", model,
    )  # fmt: skip
    bridge.wait_for(
        rf"serving {model} as {name} .*max_length 1024 \(the bridge's default\), "
        r"max_context_length 2048 \(the bridge's default\)"
    )
    until(lambda: httpx.get(f"{stack.url}/api/v2/workers/name/{name}").status_code == 200)
    worker = httpx.get(f"{stack.url}/api/v2/workers/name/{name}").json()
    assert (worker["max_length"], worker["max_context_length"]) == (1024, 2048)

    # KoboldAI Lite's 768 is taken; the openai SDK's missing max_tokens is the worker's 1024.
    sdk = openai.OpenAI(base_url=f"{stack.url}/v1", api_key=accounts["requester"], max_retries=0, timeout=120)
    lite = sdk.chat.completions.create(model=model, messages=MESSAGES, max_tokens=768, temperature=0)
    assert (lite.usage.completion_tokens, lite.choices[0].finish_reason) == (768, "length")
    whole = sdk.chat.completions.create(model=model, messages=MESSAGES, temperature=0)
    assert (whole.usage.completion_tokens, whole.choices[0].finish_reason) == (1024, "length")
    assert bridge.stop() == 0


def test_the_openai_sdk_gets_three_choices_of_the_engines_reply_through_the_bridge(
    stack, engine, accounts, bridge
) -> None:
    expected = _direct(engine, "/v1/chat/completions", messages=MESSAGES, max_tokens=24)
    sdk = openai.OpenAI(base_url=f"{stack.url}/v1", api_key=accounts["requester"], max_retries=0, timeout=120)
    whole = sdk.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=24, temperature=0, n=3)
    assert [choice.index for choice in whole.choices] == [0, 1, 2]
    assert [choice.message.content for choice in whole.choices] == [expected] * 3  # three jobs, greedy
    assert [choice.finish_reason for choice in whole.choices] == ["length"] * 3
    assert whole.usage.completion_tokens == 3 * 24
    texts: dict[int, str] = {}
    ends: dict[int, str] = {}
    stream = sdk.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=24, temperature=0, n=3, stream=True
    )
    for chunk in stream:
        for choice in chunk.choices:
            texts[choice.index] = texts.get(choice.index, "") + (choice.delta.content or "")
            if choice.finish_reason:
                ends[choice.index] = choice.finish_reason
    assert texts == {0: expected, 1: expected, 2: expected}
    assert ends == {0: "length", 1: "length", 2: "length"}
