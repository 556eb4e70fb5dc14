"""Every answer under /v1 is in the shape of the API it imitates: its 404s, 405s and 500s too."""

import json

from django.test import RequestFactory

from hordeops import api


def _openai_error(response) -> dict:
    body = json.loads(response.content)
    assert set(body) == {"error"}, body
    assert set(body["error"]) == {"message", "type", "param", "code"}, body
    return body["error"]


def test_an_unknown_v1_path_is_a_404_in_openais_shape(client):
    error = _openai_error(client.get("/v1/no-such-route"))
    assert (error["type"], error["code"]) == ("invalid_request_error", "not_found")
    horde = client.get("/api/v2/no-such-route")
    assert (horde.status_code, json.loads(horde.content)["rc"]) == (404, "NotFound")


def test_a_500_under_v1_is_in_the_protocols_shape_and_elsewhere_the_hordes():
    factory = RequestFactory()
    openai = api.server_error(factory.post("/v1/chat/completions"))
    assert openai.status_code == 500
    assert _openai_error(openai)["type"] == "server_error"
    anthropic = api.server_error(factory.post("/v1/messages"))
    assert json.loads(anthropic.content)["type"] == "error"
    horde = api.server_error(factory.get("/api/v2/workers"))
    assert json.loads(horde.content)["rc"] == "InternalError"


def test_a_v1_405_says_which_method_the_route_serves(client, db):
    for path in ("/v1/chat/completions", "/v1/responses", "/v1/messages"):
        refused = client.get(path)
        assert (refused.status_code, refused["Allow"]) == (405, "POST"), path
    refused = client.post("/v1/models")
    assert (refused.status_code, refused["Allow"]) == (405, "GET")
    assert _openai_error(refused)["code"] == "method_not_allowed"


def test_openais_stop_is_bounded_as_the_horde_routes_stop_sequence_is():
    from hordeops import errors
    from jobs.protocols import OpenAIChat

    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    assert OpenAIChat().parse({**body, "stop": ["\nYou:", "END"]}).params["stop_sequence"] == [
        "\nYou:",
        "END",
    ]
    for stop in ("", ["END", ""], ["x" * 1001, "y" * 1000], "z" * 2001):
        try:
            OpenAIChat().parse({**body, "stop": stop})
        except errors.ProtocolValidationError as err:
            assert err.param == "stop", err.param
        else:
            raise AssertionError(f"stop {stop!r:.40} was accepted")


def test_an_invalid_item_of_a_list_field_is_named_by_its_index_not_a_500():
    from hordeops import errors
    from jobs.protocols import AnthropicMessages

    body = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}
    try:
        AnthropicMessages().parse({**body, "stop_sequences": ["END", ""]})
    except errors.ProtocolValidationError as err:
        assert err.param == "stop_sequences.1" and "blank" in err.message
    else:
        raise AssertionError("a blank stop sequence was accepted")
