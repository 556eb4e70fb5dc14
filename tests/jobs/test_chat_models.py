"""GET /v1/models and /v1/models/{id}, read by the real openai and anthropic SDKs: the models
online chat workers serve now, and nothing else."""

from datetime import timedelta

import anthropic
import httpx
import openai
import pytest
from django.utils import timezone

from tests.live import ChatWorker
from workers.models import Worker

MODEL = "koboldcpp/listed-8B"
OTHER = "aphrodite/also-listed-70B"
WAIT_SECONDS = 20


@pytest.fixture
def listed(live_stack, make_caller):
    """Two chat workers online (one serving both models), a text-only worker and an offline one."""
    requester, owner = make_caller("models-requester"), make_caller("models-owner")
    [url] = live_stack.urls
    for name, model in (("lister-a", MODEL), ("lister-b", OTHER)):
        ChatWorker(url, owner.api_key, name=name, model=model).pop()
    owner.pop("text-only", models=["text/only-model"])  # not a chat worker: not offered on /v1
    owner.pop("gone", models=["gone/offline-model"], chat=True)
    Worker.objects.filter(name="gone").update(last_pop_at=timezone.now() - timedelta(hours=1))
    return url, requester


@pytest.mark.parametrize("live_stack", [1], indirect=True)
def test_openai_models_list_and_retrieve_show_what_online_chat_workers_serve(listed):
    url, requester = listed
    sdk = openai.OpenAI(base_url=f"{url}/v1", api_key=requester.api_key, max_retries=0, timeout=WAIT_SECONDS)
    models = list(sdk.models.list())
    assert [m.id for m in models] == sorted([MODEL, OTHER])
    assert all(m.object == "model" and m.owned_by == "horde" and m.created > 0 for m in models)
    retrieved = sdk.models.retrieve(MODEL)  # the id holds a slash: the path takes it whole
    assert (retrieved.id, retrieved.object) == (MODEL, "model")
    for missing in ("gone/offline-model", "text/only-model", "no/such-model"):
        with pytest.raises(openai.NotFoundError) as raised:
            sdk.models.retrieve(missing)
        assert raised.value.code == "model_not_found"
        # The chat route refuses the same models the list leaves out.
        with pytest.raises(openai.NotFoundError):
            sdk.chat.completions.create(model=missing, messages=[{"role": "user", "content": "hi"}])


@pytest.mark.parametrize("live_stack", [1], indirect=True)
def test_anthropic_models_list_pages_and_retrieve_in_anthropics_shape(listed):
    url, requester = listed
    sdk = anthropic.Anthropic(base_url=url, api_key=requester.api_key, max_retries=0, timeout=WAIT_SECONDS)
    page = sdk.models.list()
    assert [m.id for m in page.data] == sorted([MODEL, OTHER])
    assert all(m.type == "model" and m.display_name == m.id and m.created_at.tzinfo for m in page.data)
    first = sdk.models.list(limit=1)
    assert ([m.id for m in first.data], first.has_more) == ([sorted([MODEL, OTHER])[0]], True)
    # Auto-pagination follows last_id to the end.
    assert [m.id for m in sdk.models.list(limit=1)] == sorted([MODEL, OTHER])
    assert sdk.models.retrieve(OTHER).id == OTHER
    with pytest.raises(anthropic.NotFoundError) as raised:
        sdk.models.retrieve("no/such-model")
    assert raised.value.body["error"]["type"] == "not_found_error"
    headers = {"x-api-key": requester.api_key, "anthropic-version": "2023-06-01"}
    for limit in ("0", "1001", "x", "²", "9" * 4301):
        refused = httpx.get(f"{url}/v1/models", params={"limit": limit}, headers=headers)
        assert (refused.status_code, refused.json()["error"]["type"]) == (400, "invalid_request_error"), limit


@pytest.mark.parametrize("live_stack", [1], indirect=True)
def test_the_models_list_needs_a_valid_key_and_answers_in_the_clients_shape(listed):
    url, _ = listed
    openai_answer = httpx.get(f"{url}/v1/models", headers={"Authorization": "Bearer nope"})
    assert openai_answer.status_code == 401
    assert openai_answer.json()["error"]["type"] == "authentication_error"
    anthropic_answer = httpx.get(
        f"{url}/v1/models", headers={"x-api-key": "nope", "anthropic-version": "2023-06-01"}
    )
    assert anthropic_answer.status_code == 401
    assert anthropic_answer.json()["error"]["type"] == "authentication_error"
    assert httpx.get(f"{url}/v1/models").status_code == 401
