"""Agents' requests go only to workers that can serve them (issue 55): a worker declares at
each pop whether its model server takes tools and holds a reply to a JSON schema; a chat
request that needs either is offered only to workers that declare it, and refused at once when
no online worker of its model does, rather than left to wait out its life."""

import time

import pytest

from hordeops import errors
from jobs.models import TextRequest
from jobs.services import create_reply_request
from workers.models import Worker

MODEL = "chat-model"
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]
JSON_REPLY = {
    "type": "json_schema",
    "json_schema": {"name": "answer", "schema": {"type": "object", "properties": {"a": {"type": "integer"}}}},
}


def _pop(owner, name: str, **declared):
    return owner.pop(name, models=[MODEL], chat=True, max_length=1024, max_context_length=8192, **declared)


def _chat(requester, **body):
    return requester.client.post(
        "/v1/chat/completions",
        {
            "model": MODEL,
            "messages": [{"role": "user", "content": "Weather in Oslo?"}],
            "max_tokens": 32,
            **body,
        },
        format="json",
        HTTP_AUTHORIZATION=f"Bearer {requester.api_key}",
    )


def _queue(requester, needs: dict[str, str], params: dict | None = None) -> TextRequest:
    return create_reply_request(
        account=requester.account,
        address="",
        model=MODEL,
        messages=[{"role": "user", "content": "hi"}],
        max_length=32,
        params=params or {},
        needs=needs,
    )


def test_a_worker_declares_tools_and_structured_outputs_at_its_pop_and_undeclares_them_at_the_next(owner):
    assert _pop(owner, "agent", tools=True, structured_outputs=True).status_code == 200
    worker = Worker.objects.get(name="agent")
    assert (worker.tools, worker.structured_outputs) == (True, True)
    assert _pop(owner, "agent").status_code == 200  # a declaration that changes is written at once
    worker.refresh_from_db()
    assert (worker.tools, worker.structured_outputs) == (False, False)


def test_a_pop_refuses_a_capability_that_is_not_a_boolean(owner):
    refused = _pop(owner, "agent", tools="yes")
    assert refused.status_code == 400, refused.content


def test_a_chat_with_tools_is_refused_at_once_when_the_models_only_online_worker_does_not_declare_tools(
    requester, owner
):
    _pop(owner, "plain")
    started = time.monotonic()
    refused = _chat(requester, tools=TOOLS)
    assert time.monotonic() - started < 1
    assert refused.status_code == 404, refused.content
    error = refused.json()["error"]
    assert (error["code"], error["param"]) == ("capability_not_served", "tools")
    refused = _chat(requester, response_format=JSON_REPLY)
    assert (refused.status_code, refused.json()["error"]["param"]) == (404, "response_format")
    assert not TextRequest.objects.exists()


def test_a_chat_with_tools_for_a_model_nobody_serves_is_still_model_not_found(requester, owner):
    refused = _chat(requester, tools=TOOLS)
    assert (refused.status_code, refused.json()["error"]["code"]) == (404, "model_not_found")


def test_a_job_needing_tools_is_offered_only_to_a_worker_that_declares_them_with_its_tools(requester, owner):
    _pop(owner, "plain")
    _pop(owner, "agent", tools=True)
    request = _queue(requester, {"tools": "tools"}, {"tools": TOOLS, "tool_choice": "auto"})
    assert request.needs_tools and not request.needs_structured_outputs
    passed = _pop(owner, "plain").json()
    assert passed["id"] is None
    assert passed["skipped"] == {}  # a job it could never take does not exist for it
    job = _pop(owner, "agent", tools=True).json()
    assert job["id"] is not None
    assert (job["payload"]["tools"], job["payload"]["tool_choice"]) == (TOOLS, "auto")


def test_a_job_needing_both_capabilities_waits_for_a_worker_that_declares_both(requester, owner):
    _pop(owner, "tools-only", tools=True)
    _pop(owner, "json-only", structured_outputs=True)
    _pop(owner, "both", tools=True, structured_outputs=True)
    _queue(requester, {"tools": "tools", "structured_outputs": "response_format"})
    assert _pop(owner, "tools-only", tools=True).json()["id"] is None
    assert _pop(owner, "json-only", structured_outputs=True).json()["id"] is None
    assert _pop(owner, "both", tools=True, structured_outputs=True).json()["id"] is not None


@pytest.mark.parametrize("ahead", [3, 40])
def test_a_plain_worker_takes_a_plain_job_behind_many_it_cannot_take(requester, make_caller, owner, ahead):
    # 40 is past the rows a pop reads one by one (`jobs.sql.queue.NEAR_ROWS`): the rest are
    # walked by shape, and a shape does not say what its requests need.
    _pop(owner, "plain")
    _pop(owner, "agent", tools=True)
    for _ in range(ahead):
        _queue(make_caller(), {"tools": "tools"})
    plain = _queue(make_caller(), {})
    job = _pop(owner, "plain").json()
    assert job["id"] is not None
    assert TextRequest.objects.get(generations__id=job["id"]).pk == plain.pk


def test_a_capable_worker_is_not_held_back_by_the_speed_gate_of_a_faster_one_that_cannot_serve_it(
    requester, owner
):
    # The faster worker would gate the job to itself were it capable: it is not, so it gates nothing.
    _pop(owner, "fast-plain")
    _pop(owner, "slow-agent", tools=True)
    Worker.objects.filter(name="fast-plain").update(speed=1000)
    Worker.objects.filter(name="slow-agent").update(speed=0.01)
    _queue(requester, {"tools": "tools"})
    assert _pop(owner, "slow-agent", tools=True).json()["id"] is not None


def test_create_reply_request_names_the_field_that_needs_the_missing_capability(requester, owner):
    _pop(owner, "agent", tools=True)
    with pytest.raises(errors.CapabilityNotServed) as refused:
        _queue(requester, {"tools": "tools", "structured_outputs": "response_format"})
    assert refused.value.param == "response_format"


def test_v1_models_says_which_models_have_online_workers_for_tools_and_structured_output(requester, owner):
    _pop(owner, "plain")
    owner.pop("json-worker", models=["json-model"], chat=True, structured_outputs=True)
    owner.pop("agent-worker", models=["json-model", MODEL], chat=True, tools=True)
    listed = requester.client.get("/v1/models", HTTP_AUTHORIZATION=f"Bearer {requester.api_key}").json()
    parameters = {model["id"]: model["supported_parameters"] for model in listed["data"]}
    assert "tools" in parameters[MODEL] and "response_format" not in parameters[MODEL]
    assert {"tools", "tool_choice", "response_format", "structured_outputs"} <= set(parameters["json-model"])
    Worker.objects.filter(name="agent-worker").update(left_at=Worker.objects.get(name="plain").last_pop_at)
    listed = requester.client.get("/v1/models", HTTP_AUTHORIZATION=f"Bearer {requester.api_key}").json()
    parameters = {model["id"]: model["supported_parameters"] for model in listed["data"]}
    assert "tools" not in parameters[MODEL]  # its tool worker said goodbye


def test_a_chat_with_tools_falls_back_to_a_listed_model_whose_worker_declares_them(requester, owner):
    _pop(owner, "plain")  # the first model's only worker takes no tools
    owner.pop("agent", models=["tool-model"], chat=True, max_length=1024, max_context_length=8192, tools=True)
    request = create_reply_request(
        account=requester.account,
        address="",
        model=MODEL,
        fallbacks=("tool-model",),
        messages=[{"role": "user", "content": "hi"}],
        max_length=32,
        params={"tools": TOOLS},
        needs={"tools": "tools"},
    )
    assert request.requested_models == ["tool-model"] and request.needs_tools
    with pytest.raises(errors.CapabilityNotServed):  # without the fallback: refused at once
        create_reply_request(
            account=requester.account,
            address="",
            model=MODEL,
            messages=[{"role": "user", "content": "hi"}],
            max_length=32,
            params={"tools": TOOLS},
            needs={"tools": "tools"},
        )


def test_tools_with_several_choices_are_refused_naming_n(requester, owner):
    _pop(owner, "agent", tools=True)
    refused = _chat(requester, tools=TOOLS, n=2)
    assert refused.status_code == 400, refused.content
    assert refused.json()["error"]["param"] == "n"
    assert not TextRequest.objects.exists()
