"""Every path under /v1 answers in the shape of the API it imitates, and Anthropic's token count
is the horde's own estimate, each read by the SDK that calls it."""

import json

import anthropic
import openai
import pytest

from jobs.services import prompt_tokens, render_chat_prompt

pytestmark = pytest.mark.parametrize("live_stack", [1], indirect=True)

MESSAGES = [{"role": "user", "content": "Count the words of this sentence, please."}]


@pytest.fixture
def requester_key(make_caller) -> str:
    return make_caller("v1-paths").api_key


def _anthropic(base_url: str, api_key: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=base_url, api_key=api_key, max_retries=0, timeout=20)


def test_anthropics_count_tokens_answers_the_hordes_estimate_of_the_prompt(live_stack, requester_key):
    sdk = _anthropic(live_stack.urls[0], requester_key)
    counted = sdk.messages.count_tokens(model="any-model", messages=MESSAGES, system="Be brief.")
    expected = prompt_tokens(render_chat_prompt([{"role": "system", "content": "Be brief."}, *MESSAGES]))
    assert counted.input_tokens == expected > 0
    with pytest.raises(anthropic.AuthenticationError):
        _anthropic(live_stack.urls[0], "not-a-key").messages.count_tokens(model="m", messages=MESSAGES)
    with pytest.raises(anthropic.BadRequestError) as refused:
        sdk.messages.count_tokens(model="m", messages=[])
    assert refused.value.body["error"]["type"] == "invalid_request_error"


def test_an_unknown_anthropic_path_is_anthropics_404_and_the_sdk_reads_it(live_stack, requester_key):
    with pytest.raises(anthropic.NotFoundError) as raised:
        _anthropic(live_stack.urls[0], requester_key).messages.batches.list()
    assert raised.value.body == {
        "type": "error",
        "error": {"type": "not_found_error", "message": "Not found."},
    }


def test_an_unknown_openai_path_is_openais_404_and_the_sdk_reads_it(live_stack, requester_key):
    sdk = openai.OpenAI(base_url=f"{live_stack.urls[0]}/v1", api_key=requester_key, max_retries=0, timeout=20)
    for call in (
        lambda: sdk.embeddings.create(model="m", input="x"),
        lambda: sdk.responses.retrieve("resp_1"),
    ):
        with pytest.raises(openai.NotFoundError) as raised:
            call()
        assert raised.value.body["code"] == "not_found" and "rc" not in json.dumps(raised.value.body)
