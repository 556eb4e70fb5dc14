"""Sampling knobs beyond temperature and top_p (`top_k`, `min_p`, `typical_p`,
`repetition_penalty`, `frequency_penalty`, `presence_penalty`, `logit_bias`) on the /v1 routes:
validated in each protocol's error shape, and carried to the worker in the job's params under
the horde's names. The bridge's tests (tests/bridge/test_samplers.py) follow them on to a real
engine."""

import json

import pytest

from hordeops import errors
from jobs.models import TextRequest
from jobs.protocols import AnthropicMessages, OpenAIChat, OpenAICompletions, OpenAIResponses
from jobs.services import create_reply_request

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
SAMPLERS = {
    "top_k": 40,
    "min_p": 0.05,
    "typical_p": 0.9,
    "repetition_penalty": 1.1,
    "frequency_penalty": 0.5,
    "presence_penalty": -0.5,
    "logit_bias": {"50256": -100, "0007": 2.5},
}
# The same knobs under the horde's params names, as the worker's payload carries them.
HORDE_PARAMS = {
    "top_k": 40,
    "min_p": 0.05,
    "typical": 0.9,
    "rep_pen": 1.1,
    "frequency_penalty": 0.5,
    "presence_penalty": -0.5,
    "logit_bias": {"50256": -100, "7": 2.5},
}


def test_chat_completions_samplers_become_the_horde_params_by_their_horde_names():
    call = OpenAIChat().parse({**CHAT, **SAMPLERS, "temperature": 0.7, "seed": 3})
    assert call.params == {**HORDE_PARAMS, "temperature": 0.7, "sampler_seed": 3}


def test_completions_and_responses_take_the_same_samplers_and_messages_takes_top_k():
    completion = OpenAICompletions().parse({"model": "m", "prompt": "Once", **SAMPLERS})
    assert completion.params == HORDE_PARAMS
    response = OpenAIResponses().parse({"model": "m", "input": "hi", **SAMPLERS})
    assert response.params == HORDE_PARAMS
    message = AnthropicMessages().parse({**CHAT, "max_tokens": 10, "top_k": 5})
    assert message.params == {"top_k": 5}


def test_samplers_sent_as_null_or_an_empty_bias_are_left_out_of_the_params():
    nulls = {name: None for name in SAMPLERS}
    assert OpenAIChat().parse({**CHAT, **nulls}).params == {}
    assert OpenAIChat().parse({**CHAT, "logit_bias": {}}).params == {}


BAD_SAMPLERS = [
    ("top_k", -1),
    ("top_k", 201),
    ("top_k", 1.5),
    ("min_p", 1.5),
    ("typical_p", -0.1),
    ("repetition_penalty", 0.5),
    ("repetition_penalty", 3.5),
    ("frequency_penalty", 2.5),
    ("presence_penalty", -3),
    ("presence_penalty", "high"),
    ("logit_bias", {"fifty": 1}),
    ("logit_bias", {"-5": 1}),
    ("logit_bias", {"5": 101}),
    ("logit_bias", {"5": "ban"}),
    ("logit_bias", {str(token): 1 for token in range(301)}),
    ("logit_bias", [5, -100]),
]


@pytest.mark.parametrize(("name", "value"), BAD_SAMPLERS)
def test_a_sampler_out_of_its_bounds_is_a_400_naming_it_on_the_openai_routes(name, value):
    for protocol, body in (
        (OpenAIChat(), CHAT),
        (OpenAICompletions(), {"model": "m", "prompt": "Once"}),
        (OpenAIResponses(), {"model": "m", "input": "hi"}),
    ):
        with pytest.raises(errors.ProtocolValidationError) as refused:
            protocol.parse({**body, name: value})
        answer = protocol.error_response(refused.value)
        error = json.loads(answer.content)["error"]
        assert answer.status_code == 400, protocol.path
        assert error["type"] == "invalid_request_error", protocol.path
        # The knob, or the entry of it that is wrong (`logit_bias.5`).
        assert error["param"].split(".")[0] == name, (protocol.path, error["param"])


def test_a_top_k_out_of_bounds_is_a_400_in_anthropics_shape():
    protocol = AnthropicMessages()
    with pytest.raises(errors.ProtocolValidationError) as refused:
        protocol.parse({**CHAT, "max_tokens": 10, "top_k": -2})
    answer = protocol.error_response(refused.value)
    body = json.loads(answer.content)
    assert answer.status_code == 400
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert body["error"]["message"].startswith("top_k: ")


def _queue(requester, *, chat: bool, model: str = "sampler-model") -> TextRequest:
    call = OpenAIChat().parse({**CHAT, "model": model, **SAMPLERS})
    return create_reply_request(
        account=requester.account,
        address="",
        model=model,
        messages=call.messages if chat else None,
        prompt=None if chat else "Once upon a time",
        max_length=32,
        params=call.params,
    )


def test_a_chat_workers_pop_carries_every_sampler_by_its_horde_name(requester, owner):
    declared = {"models": ["sampler-model"], "chat": True, "max_length": 512}
    owner.pop("bridge", **declared)
    _queue(requester, chat=True)
    job = owner.pop("bridge", **declared).json()
    assert job["kind"] == "chat"
    assert {name: job["payload"].get(name) for name in HORDE_PARAMS} == HORDE_PARAMS


def test_a_legacy_workers_pop_keeps_the_ai_hordes_knobs_and_leaves_out_openais_own(requester, owner):
    declared = {"models": ["sampler-model"], "max_length": 512}
    owner.pop("scribe", **declared)
    _queue(requester, chat=False)
    payload = owner.pop("scribe", **declared).json()["payload"]
    assert (payload["top_k"], payload["min_p"], payload["typical"], payload["rep_pen"]) == (
        40,
        0.05,
        0.9,
        1.1,
    )
    # horde_sdk's strict mode refuses a payload key the AI Horde does not send.
    assert not {"frequency_penalty", "presence_penalty", "logit_bias"} & set(payload)


def test_the_async_route_takes_openais_penalties_and_logit_bias_in_params_for_a_chat_worker(requester, owner):
    declared = {"models": ["sampler-model"], "chat": True, "max_length": 512}
    owner.pop("bridge", **declared)
    params = {
        "max_length": 32,
        "top_k": 1,
        "rep_pen": 1.2,
        "frequency_penalty": 1.0,
        "logit_bias": {"9": -100},
    }
    queued = requester.request_text(params=params, models=["sampler-model"])
    assert queued.status_code == 202, queued.content
    payload = owner.pop("bridge", **declared).json()["payload"]
    assert {name: payload[name] for name in params} == params


@pytest.mark.parametrize(
    "params", [{"logit_bias": {"x": 1}}, {"logit_bias": {"1": -101}}, {"presence_penalty": 2.5}]
)
def test_the_async_route_refuses_a_bad_penalty_or_bias_in_the_hordes_shape(requester, params):
    refused = requester.request_text(params=params)
    assert refused.status_code == 400, refused.content
    body = refused.json()
    assert body["rc"] == "RequestValidationFailed" or body.get("errors"), body
    assert TextRequest.objects.count() == 0
