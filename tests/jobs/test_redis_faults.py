"""Redis killed (SIGKILL) under open chat requests, on a redis-server of the test's own: a
committed stream ends with its protocol's error event, no [DONE] or stop event, and the job
is cancelled; a request still waiting is cancelled and answered 503, saying so, with
`x-should-retry: false`; nothing is left queued for after recovery."""

import json
import time

import httpx
import pytest

from jobs.models import Generation, TextRequest
from tests.live import Background, ChatWorker, committed_stream_cut

MODEL = "koboldcpp/faults-8B"
WAIT_SECONDS = 20
# How soon after the kill the requester must be told.
TOLD_WITHIN_SECONDS = 5

BODIES = {
    "/v1/chat/completions": {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": True},
    "/v1/responses": {"model": MODEL, "input": "hi", "stream": True},
    "/v1/messages": {
        "model": MODEL,
        "max_tokens": 64,
        "messages": [{"role": "user", "content": "hi"}],
        "stream": True,
    },
}
# What each protocol's error event says when the service failed.
ERROR_MARKS = {"/v1/chat/completions": "service_unavailable", "/v1/responses": "service_unavailable",
               "/v1/messages": "overloaded_error"}  # fmt: skip
ENDINGS = ("[DONE]", "response.completed", "message_stop")


@pytest.mark.parametrize("live_stack", [1], indirect=True)
@pytest.mark.parametrize("path", list(BODIES))
def test_a_committed_stream_ends_with_an_error_event_when_redis_dies(
    private_redis, live_stack, make_caller, path
):
    [url] = live_stack.urls
    requester, owner = make_caller("faults-requester"), make_caller("faults-owner")
    worker = ChatWorker(url, owner.api_key, name="faults-worker", model=MODEL)
    worker.pop()
    tail, told_after, generation_id = committed_stream_cut(
        url, requester.api_key, worker, path, BODIES[path], private_redis.kill
    )
    assert ERROR_MARKS[path] in tail, tail
    assert not any(ending in tail for ending in ENDINGS), tail
    assert told_after < TOLD_WITHIN_SECONDS
    generation = Generation.objects.get(pk=generation_id)
    assert generation.state == Generation.State.CANCELLED
    assert generation.request.state == TextRequest.State.CANCELLED
    assert generation.request.queued == 0

    # Redis back, empty (no persistence): the worker is told the truth, not ProgressOutOfOrder,
    # and the horde carries on with the next request.
    private_redis.start()
    after = worker.progress(" more")
    assert (after.status_code, after.json()["rc"]) == (409, "GenerationCancelled")
    serving = Background(lambda: (worker.pop_job(), worker.progress("Fine"), worker.submit("Fine, thanks.")))
    headers = {"Authorization": f"Bearer {requester.api_key}", "anthropic-version": "2023-06-01"}
    with httpx.Client(base_url=url, headers=headers, timeout=WAIT_SECONDS) as http:
        with http.stream("POST", path, json=BODIES[path]) as response:
            assert response.status_code == 200
            text = "".join(response.iter_text())
    serving.result()
    assert "thanks" in text and any(ending in text for ending in ENDINGS), text


@pytest.mark.parametrize("live_stack", [1], indirect=True)
def test_a_waiting_request_is_cancelled_and_answered_503_when_redis_dies(
    private_redis, live_stack, make_caller
):
    [url] = live_stack.urls
    requester, owner = make_caller("faults-requester"), make_caller("faults-owner")
    ChatWorker(url, owner.api_key, name="faults-worker", model=MODEL).pop()  # known, but serving nothing
    headers = {"Authorization": f"Bearer {requester.api_key}"}

    def ask() -> httpx.Response:
        with httpx.Client(base_url=url, headers=headers, timeout=WAIT_SECONDS) as http:
            return http.post("/v1/chat/completions", json={**BODIES["/v1/chat/completions"], "stream": False})

    asking = Background(ask)
    deadline = time.monotonic() + WAIT_SECONDS
    while not TextRequest.objects.filter(state=TextRequest.State.ACTIVE).exists():
        assert time.monotonic() < deadline, "the request was not queued"
        time.sleep(0.05)
    time.sleep(0.3)  # the requester is now waiting on the relay
    private_redis.kill()
    answer = asking.result()
    assert answer.status_code == 503, answer.text
    assert answer.headers["x-should-retry"] == "false"
    error = json.loads(answer.text)["error"]
    assert error["code"] == "service_unavailable" and "nothing is left queued" in error["message"]
    [request] = TextRequest.objects.all()
    assert (request.state, request.queued) == (TextRequest.State.CANCELLED, 0)


# Redis as the web process sees it when it is down: nothing listens on port 1.
DEAD_REDIS = {
    "default": {
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": "redis://127.0.0.1:1/0",
        "OPTIONS": {"SOCKET_CONNECT_TIMEOUT": 0.5, "SOCKET_TIMEOUT": 0.5},
    }
}


@pytest.mark.django_db(transaction=True)
def test_a_give_back_made_while_redis_is_down_takes_effect_and_is_answered_so(owner, chat_job, settings):
    job = chat_job(owner)
    settings.CACHES = DEAD_REDIS
    given_back = owner.submit(job["id"], "", state="faulted")
    assert given_back.status_code == 200, given_back.content
    generation = Generation.objects.get(pk=job["id"])
    assert generation.state == Generation.State.FAULTED
    assert generation.request.queued == 1  # back in the queue, for another worker
    again = owner.submit(job["id"], "", state="faulted")
    assert (again.status_code, again.json()["rc"]) == (400, "AbortedGen")


@pytest.mark.django_db(transaction=True)
def test_a_chat_submit_answered_503_while_redis_is_down_did_not_happen(owner, chat_job, settings):
    job = chat_job(owner)
    settings.CACHES = DEAD_REDIS
    refused = owner.submit(job["id"], "The end.")
    assert refused.status_code == 503
    generation = Generation.objects.get(pk=job["id"])
    assert (generation.state, generation.text) == (Generation.State.PROCESSING, None)
