"""OpenRouter's `models` beside `model` on the /v1 routes: any listed model with an online worker
may serve the request, the first such one preferred (offered alone for WARM_WORKER_SECONDS
to a free worker of it); it is refused at once only when none of them has one. The answer's
`model` names the model that served it (the live tests at the end)."""

import json
from datetime import UTC, datetime, timedelta

import httpx
import openai
import pytest

from hordeops import errors
from jobs.models import Generation, TextRequest
from jobs.protocols import AnthropicMessages, OpenAIChat, OpenAICompletions, OpenAIResponses
from jobs.services import create_reply_request
from tests.live import Background, ChatWorker
from workers.models import Worker

CHAT = {"model": "first", "messages": [{"role": "user", "content": "hi"}]}
DECLARED = {"chat": True, "max_length": 512, "max_context_length": 4096}


@pytest.fixture(autouse=True)
def _window(settings):
    settings.WARM_WORKER_SECONDS = 2


def _queue(requester, model: str, *fallbacks: str, max_length: int | None = 64) -> TextRequest:
    return create_reply_request(
        account=requester.account,
        address="",
        model=model,
        fallbacks=fallbacks,
        messages=[{"role": "user", "content": "hi"}],
        max_length=max_length,
        params={},
    )


def _online(owner, name: str, model: str, **declared) -> None:
    answer = owner.pop(name, models=[model], **{**DECLARED, **declared})
    assert answer.status_code == 200 and answer.json()["id"] is None, answer.content


def _job(owner, name: str, model: str) -> dict:
    answer = owner.pop(name, models=[model], **DECLARED)
    assert answer.status_code == 200, answer.content
    return answer.json()


def test_every_protocol_reads_the_models_list_beside_model():
    assert OpenAIChat().parse({**CHAT, "models": ["second", "third"]}).models == ("second", "third")
    assert OpenAICompletions().parse({"model": "a", "prompt": "x", "models": ["b"]}).models == ("b",)
    assert OpenAIResponses().parse({"model": "a", "input": "x", "models": ["b"]}).models == ("b",)
    assert AnthropicMessages().parse({**CHAT, "max_tokens": 5, "models": ["b"]}).models == ("b",)
    assert OpenAIChat().parse({**CHAT, "models": None}).models == ()


@pytest.mark.parametrize("models", ["second", [1], ["x" * 256], [f"m{i}" for i in range(9)]])
def test_a_models_list_that_is_not_up_to_8_names_is_a_400_naming_models(models):
    with pytest.raises(errors.ProtocolValidationError) as refused:
        OpenAIChat().parse({**CHAT, "models": models})
    assert refused.value.param.split(".")[0] == "models"


def test_a_request_whose_model_has_no_online_worker_is_queued_for_its_online_fallbacks(requester, owner):
    _online(owner, "third-worker", "third")
    request = _queue(requester, "first", "second", "third")
    assert request.requested_models == ["third"]
    job = _job(owner, "third-worker", "third")
    assert (job["id"] is not None, job["model"]) == (True, "third")


def test_a_request_none_of_whose_models_has_an_online_worker_is_refused_at_once_as_model_not_found(
    requester, owner
):
    _online(owner, "other-worker", "other")
    with pytest.raises(errors.UnknownModel) as refused:
        _queue(requester, "first", "second")
    answer = OpenAIChat().error_response(refused.value)
    error = json.loads(answer.content)["error"]
    assert (answer.status_code, error["code"]) == (404, "model_not_found")
    assert "first, second" in error["message"]
    assert TextRequest.objects.count() == 0


def test_the_first_listed_model_is_preferred_when_both_have_a_free_worker(requester, owner, time_machine):
    time_machine.move_to(datetime.now(UTC), tick=False)
    _online(owner, "first-worker", "first")
    _online(owner, "second-worker", "second")
    request = _queue(requester, "first", "second")
    assert request.requested_models == ["first", "second"]
    assert request.preferred_worker == Worker.objects.get(name="first-worker").pk
    assert _job(owner, "second-worker", "second")["id"] is None  # within the first model's window
    job = _job(owner, "first-worker", "first")
    assert (job["id"] is not None, job["model"]) == (True, "first")


def test_the_fallback_takes_the_request_once_the_first_models_window_is_over(requester, owner, time_machine):
    time_machine.move_to(datetime.now(UTC), tick=False)
    _online(owner, "first-worker", "first")
    _online(owner, "second-worker", "second")
    _queue(requester, "first", "second")
    time_machine.shift(timedelta(seconds=2.1))
    assert _job(owner, "second-worker", "second")["model"] == "second"


def test_the_fallback_takes_the_request_at_once_when_the_first_models_worker_is_busy(requester, owner):
    _online(owner, "first-worker", "first")
    _online(owner, "second-worker", "second")
    _queue(requester, "first")  # keeps the first model's only worker busy
    assert _job(owner, "first-worker", "first")["id"] is not None
    request = _queue(requester, "first", "second")
    assert request.preferred_worker is None
    job = _job(owner, "second-worker", "second")
    assert Generation.objects.get(pk=job["id"]).request_id == request.pk and job["model"] == "second"


def test_a_fallback_whose_workers_take_a_shorter_reply_than_asked_is_left_out(requester, owner):
    _online(owner, "short-worker", "short", max_length=64)
    _online(owner, "long-worker", "long", max_length=512)
    assert _queue(requester, "short", "long", max_length=300).requested_models == ["long"]
    with pytest.raises(errors.ReplyTooLong) as refused:
        _queue(requester, "short", "long", max_length=600)
    assert "at most 512 tokens" in refused.value.message


def test_without_max_tokens_the_reply_is_the_most_the_first_online_models_workers_accept(requester, owner):
    _online(owner, "short-worker", "short", max_length=64)
    _online(owner, "long-worker", "long", max_length=512)
    request = _queue(requester, "absent", "long", "short", max_length=None)
    assert (request.max_length, request.requested_models) == (512, ["long"])
    request = _queue(requester, "short", "long", max_length=None)
    assert (request.max_length, request.requested_models) == (64, ["short", "long"])


# --- Live: the answer names the model that served it --------------------------------------------

LIVE_MODEL = "koboldcpp/fallback-13B"


@pytest.mark.parametrize("live_stack", [1], indirect=True)
def test_the_answers_model_is_the_fallback_that_served_it_streamed_and_not(live_stack, make_caller):
    requester, owner = make_caller("fallback-requester"), make_caller("fallback-owner")
    worker = ChatWorker(live_stack.urls[0], owner.api_key, name="fallback-worker", model=LIVE_MODEL)
    assert worker.pop()["id"] is None
    sdk = openai.OpenAI(
        base_url=f"{live_stack.urls[0]}/v1", api_key=requester.api_key, max_retries=0, timeout=30
    )

    def serve() -> None:
        worker.pop_job()
        worker.stream(["Hello", " there."])
        assert worker.submit("Hello there.").status_code == 200

    serving = Background(serve)
    whole = sdk.chat.completions.create(
        model="absent/model", messages=[{"role": "user", "content": "hi"}], max_tokens=16,
        extra_body={"models": ["also/absent", LIVE_MODEL]},
    )  # fmt: skip
    serving.result()
    assert (whole.model, whole.choices[0].message.content) == (LIVE_MODEL, "Hello there.")

    serving = Background(serve)
    chunks = list(
        sdk.chat.completions.create(
            model="absent/model", messages=[{"role": "user", "content": "hi"}], max_tokens=16, stream=True,
            extra_body={"models": [LIVE_MODEL]},
        )
    )  # fmt: skip
    serving.result()
    assert {chunk.model for chunk in chunks} == {LIVE_MODEL}
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "Hello there."

    refused = httpx.post(
        f"{live_stack.urls[0]}/v1/chat/completions",
        json={
            "model": "absent/model",
            "models": ["also/absent"],
            "messages": [{"role": "user", "content": "hi"}],
        },
        headers={"Authorization": f"Bearer {requester.api_key}"},
        timeout=10,
    )
    assert refused.status_code == 404 and refused.json()["error"]["code"] == "model_not_found"
