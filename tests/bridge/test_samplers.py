"""The samplers a requester sets reach the real engine through the horde and the bridge: each
case gives, through the horde, exactly the engine's own reply to the same knob, and that reply
differs from the engine's without the knob, so a knob dropped on the way fails its case. The
engine (tests/bridge/engine.py) has a byte vocabulary: token 3 + b is the byte b."""

import httpx
import pytest

from hordeops_bridge.backends import backend_for
from hordeops_bridge.job import Job, request_for
from tests.bridge.conftest import MODEL
from tests.bridge.test_serving import _horde_text

pytestmark = pytest.mark.timeout(240)
PROMPT = "The sampler test"
TOKENS = 32


def _engine(engine, path: str, body: dict) -> str:
    answer = httpx.post(f"{engine.url}{path}", json={"max_tokens": TOKENS, **body}, timeout=60).json()
    choice = answer["choices"][0]
    return choice["message"]["content"] if "message" in choice else choice["text"]


def _v1(stack, key: str, path: str, body: dict) -> str:
    answer = httpx.post(
        f"{stack.url}{path}",
        json={"model": MODEL, "max_tokens": TOKENS, **body},
        headers={"Authorization": f"Bearer {key}"},
        timeout=60,
    )
    assert answer.status_code == 200, answer.text
    choice = answer.json()["choices"][0]
    return choice["message"]["content"] if "message" in choice else choice["text"]


def _token(character: str) -> str:
    return str(3 + ord(character))


def test_each_openai_sampler_reaches_the_engine_and_shapes_the_reply_as_it_does_there(
    stack, engine, accounts, bridge
) -> None:
    greedy = _engine(engine, "/v1/completions", {"prompt": PROMPT, "temperature": 0})
    sampled = {"temperature": 2, "seed": 1}
    cases = [
        # (the requester's knobs, the same knobs in the engine's names, the engine's reply without them)
        ({**sampled, "top_k": 1}, {**sampled, "top_k": 1}, sampled),
        ({**sampled, "min_p": 1.0}, {**sampled, "min_p": 1.0}, sampled),
        ({"temperature": 0, "repetition_penalty": 3}, {"temperature": 0, "repeat_penalty": 3}, None),
        ({"temperature": 0, "frequency_penalty": 2}, {"temperature": 0, "frequency_penalty": 2}, None),
        ({"temperature": 0, "presence_penalty": 2}, {"temperature": 0, "presence_penalty": 2}, None),
    ]
    ban = {"temperature": 0, "logit_bias": {_token(greedy[0]): -100}}
    cases.append((ban, ban, None))
    for knobs, engine_knobs, without in cases:
        expected = _engine(engine, "/v1/completions", {"prompt": PROMPT, **engine_knobs})
        plain = (
            greedy if without is None else _engine(engine, "/v1/completions", {"prompt": PROMPT, **without})
        )
        assert expected != plain, knobs  # the knob changes this engine's reply
        assert (
            _v1(stack, accounts["requester"], "/v1/completions", {"prompt": PROMPT, **knobs}) == expected
        ), knobs
    assert not expected.startswith(greedy[0])  # the banned token is kept out of the reply


def test_top_k_of_1_makes_a_sampled_chat_reply_the_greedy_one(stack, engine, accounts, bridge) -> None:
    messages = [{"role": "user", "content": "Say hello."}]
    greedy = _engine(engine, "/v1/chat/completions", {"messages": messages, "temperature": 0})
    sampled = {"messages": messages, "temperature": 2, "seed": 1}
    assert _engine(engine, "/v1/chat/completions", sampled) != greedy
    assert _v1(stack, accounts["requester"], "/v1/chat/completions", {**sampled, "top_k": 1}) == greedy


def test_the_ai_hordes_params_names_on_the_async_route_reach_the_engine(
    stack, engine, accounts, bridge
) -> None:
    greedy = _engine(engine, "/v1/completions", {"prompt": PROMPT, "temperature": 0})
    for params, engine_knobs in (
        ({"temperature": 0, "rep_pen": 3}, {"temperature": 0, "repeat_penalty": 3}),
        ({"temperature": 0, "presence_penalty": 2}, {"temperature": 0, "presence_penalty": 2}),
    ):
        expected = _engine(engine, "/v1/completions", {"prompt": PROMPT, **engine_knobs})
        assert expected != greedy, params
        status = _horde_text(stack, accounts["requester"], PROMPT, max_length=TOKENS, **params)
        assert status["generations"][0]["text"] == expected, params


# The payload's names as each backend's request names them (no server: the request's body).
PAYLOAD = {
    "prompt": "p", "max_length": 24, "temperature": 0.5, "top_p": 0.9, "top_k": 40, "min_p": 0.05,
    "typical": 0.9, "rep_pen": 1.1, "frequency_penalty": 0.5, "presence_penalty": -0.5,
    "logit_bias": {"7": -100}, "sampler_seed": 3, "stop_sequence": ["\n\n"],
}  # fmt: skip


def test_an_openai_compatible_server_is_sent_every_payload_sampler_under_its_own_name(caplog) -> None:
    backend = backend_for("openai", "http://127.0.0.1:9")
    job = Job(id="j", kind="text", model="m", payload=PAYLOAD)
    body = backend.body(request_for(job), model="served")
    assert {name: body.get(name) for name in ENGINE_NAMES} == ENGINE_NAMES
    assert "cannot honour" not in caplog.text


ENGINE_NAMES = {
    "temperature": 0.5, "top_p": 0.9, "top_k": 40, "min_p": 0.05, "typical_p": 0.9,
    "repeat_penalty": 1.1, "repetition_penalty": 1.1, "frequency_penalty": 0.5,
    "presence_penalty": -0.5, "logit_bias": {"7": -100}, "seed": 3, "stop": ["\n\n"],
}  # fmt: skip


def test_koboldcpp_is_sent_the_payload_as_it_is_and_its_missing_knob_is_logged_once(caplog) -> None:
    backend = backend_for("kobold", "http://127.0.0.1:9")
    job = Job(id="j", kind="text", model="m", payload=PAYLOAD)
    for _ in range(3):
        body = backend.body(request_for(job), budget=1024, genkey="KCPPx")
    assert (body["presence_penalty"], body["logit_bias"], body["typical"]) == (-0.5, {"7": -100}, 0.9)
    assert caplog.text.count("cannot honour") == 1 and "cannot honour frequency_penalty" in caplog.text
