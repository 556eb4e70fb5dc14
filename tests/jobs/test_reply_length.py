"""A /v1 request's reply length is the online workers' of its model to decide (issue 50): a
missing `max_tokens` is the most they accept, and one above that is refused at once, where it
used to wait in silence for 20 minutes that no worker could take it."""

import time
from datetime import timedelta

import anthropic
import openai
import pytest
from django.utils import timezone

from jobs.models import TextRequest
from jobs.services import create_reply_request, prompt_tokens, render_chat_prompt
from tests.live import Background, ChatWorker
from workers.models import Worker

MODEL = "openai/short-replies-1B"
REPLY = "Short and sweet."
# Longer than the SDK call may take: a request no worker could take would wait out this bound.
SDK_TIMEOUT_SECONDS = 15
# What "at once" and "within seconds" mean here, on two shared cores.
PROMPT_ANSWER_SECONDS = 5


def _serve_one(worker: ChatWorker) -> dict:
    """Pop the next job, chat or text, and submit a reply to it: a worker thread as the bridge
    would run."""
    deadline = time.monotonic() + SDK_TIMEOUT_SECONDS
    while (job := worker.pop())["id"] is None:
        assert time.monotonic() < deadline, "no job came"
        time.sleep(0.05)
    worker.job = job
    assert worker.submit(REPLY).status_code == 200
    return job


@pytest.fixture
def fleet(make_caller):
    """The model's only online worker accepts 512 tokens of reply; an offline one of the same
    model and an online one of another model accept far more, and count for nothing."""
    requester, owner = make_caller("lengths-requester"), make_caller("lengths-owner")

    def start(url: str) -> ChatWorker:
        worker = ChatWorker(
            url, owner.api_key, name="short", model=MODEL, max_length=512, max_context_length=2048
        )
        assert worker.pop()["id"] is None
        ChatWorker(url, owner.api_key, name="other-model", model="openai/long-replies-70B").pop()
        ChatWorker(url, owner.api_key, name="gone", model=MODEL, max_length=8192).pop()
        Worker.objects.filter(name="gone").update(last_pop_at=timezone.now() - timedelta(hours=1))
        return worker

    return requester, start


@pytest.mark.parametrize("live_stack", [1], indirect=True)
def test_the_openai_sdk_without_max_tokens_gets_the_most_the_online_worker_accepts_within_seconds(
    live_stack, fleet
):
    requester, start = fleet
    [url] = live_stack.urls
    worker = start(url)
    sdk = openai.OpenAI(
        base_url=f"{url}/v1", api_key=requester.api_key, max_retries=0, timeout=SDK_TIMEOUT_SECONDS
    )
    for call in (
        lambda: sdk.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Say hi."}]),
        lambda: sdk.responses.create(model=MODEL, input="Say hi."),
        lambda: sdk.completions.create(model=MODEL, prompt="Say hi."),
    ):
        serving = Background(_serve_one, worker)
        started = time.monotonic()
        call()
        assert time.monotonic() - started < PROMPT_ANSWER_SECONDS
        assert serving.result()["payload"]["max_length"] == 512


@pytest.mark.parametrize("live_stack", [1], indirect=True)
def test_a_max_tokens_above_what_any_online_worker_accepts_is_refused_at_once_in_the_routes_shape(
    live_stack, fleet
):
    requester, start = fleet
    [url] = live_stack.urls
    start(url)
    sdk = openai.OpenAI(
        base_url=f"{url}/v1", api_key=requester.api_key, max_retries=0, timeout=SDK_TIMEOUT_SECONDS
    )
    hi = [{"role": "user", "content": "Say hi."}]
    for field, call in (
        ("max_tokens", lambda: sdk.chat.completions.create(model=MODEL, messages=hi, max_tokens=2000)),
        (
            "max_completion_tokens",
            lambda: sdk.chat.completions.create(model=MODEL, messages=hi, max_completion_tokens=513),
        ),
        (
            "max_output_tokens",
            lambda: sdk.responses.create(model=MODEL, input="Say hi.", max_output_tokens=2000),
        ),
        ("max_tokens", lambda: sdk.completions.create(model=MODEL, prompt="Say hi.", max_tokens=2000)),
    ):
        started = time.monotonic()
        with pytest.raises(openai.BadRequestError) as refused:
            call()
        assert time.monotonic() - started < PROMPT_ANSWER_SECONDS
        error = refused.value.body
        assert (error["type"], error["code"], error["param"]) == (
            "invalid_request_error",
            "max_tokens_too_large",
            field,
        )
        assert "at most 512" in error["message"]
    claude = anthropic.Anthropic(
        base_url=url, api_key=requester.api_key, max_retries=0, timeout=SDK_TIMEOUT_SECONDS
    )
    started = time.monotonic()
    with pytest.raises(anthropic.BadRequestError) as refused:
        claude.messages.create(model=MODEL, max_tokens=2000, messages=hi)
    assert time.monotonic() - started < PROMPT_ANSWER_SECONDS
    assert refused.value.body["type"] == "error"
    assert refused.value.body["error"]["type"] == "invalid_request_error"
    assert "at most 512" in refused.value.body["error"]["message"]
    assert not TextRequest.objects.filter(account=requester.account).exists()


def test_without_a_limit_a_long_prompt_gets_the_reply_the_workers_context_has_room_for(requester, owner):
    owner.pop("short", models=[MODEL], chat=True, max_length=512, max_context_length=800)
    owner.pop("roomy", models=[MODEL], chat=True, max_length=300, max_context_length=4096)
    messages = [{"role": "user", "content": "word " * 320}]  # about 400 tokens as the horde counts
    room = 800 - prompt_tokens(render_chat_prompt(messages))
    assert 300 < room < 512
    chat = create_reply_request(
        account=requester.account, address="", model=MODEL, messages=messages, max_length=None, params={}
    )
    # The short worker holds this prompt with `room` tokens of reply, more than the roomy one's 300.
    assert (chat.max_length, chat.max_context_length) == (room, 800)
    longer = [{"role": "user", "content": "word " * 1000}]
    chat = create_reply_request(
        account=requester.account, address="", model=MODEL, messages=longer, max_length=None, params={}
    )
    assert chat.max_length == 300  # only the roomy worker holds this prompt
    text = create_reply_request(
        account=requester.account, address="", model=MODEL, prompt="hi", max_length=None, params={}
    )
    assert text.max_length == 512
