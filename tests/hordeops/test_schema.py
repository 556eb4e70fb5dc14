"""The OpenAPI schema at /api/schema/ is valid and covers every route."""

import re

import yaml
from openapi_spec_validator import validate
from rest_framework.exceptions import ValidationError
from rest_framework.test import APIClient

from hordeops.serializers import NOT_ONLY_WHITE_SPACE, StrictCharField


def test_the_schema_is_valid_openapi_and_lists_every_route(db):
    answer = APIClient().get("/api/schema/")
    assert answer.status_code == 200
    schema = yaml.safe_load(answer.content)
    validate(schema)
    paths = schema["paths"]
    assert set(paths) >= {
        "/api/v2/generate/text/async",
        "/api/v2/generate/text/status/{request_id}",
        "/api/v2/generate/text/pop",
        "/api/v2/generate/text/submit",
        "/api/v2/status/heartbeat",
    }
    assert {"get", "delete"} <= set(paths["/api/v2/generate/text/status/{request_id}"])
    assert "apikey" in schema["components"]["securitySchemes"]


def test_the_schema_generates_without_warnings(tmp_path):
    from django.core.management import call_command

    call_command("spectacular", "--validate", "--fail-on-warn", "--file", str(tmp_path / "schema.yaml"))
    assert (tmp_path / "schema.yaml").read_text().startswith("openapi: 3")


def _schema() -> dict:
    return yaml.safe_load(APIClient().get("/api/schema/").content)


def _served_paths() -> set[str]:
    """Every route the URLconf serves under /api/v2/ and /v1/, written as the schema writes it."""
    import re

    from django.urls import URLPattern, URLResolver, get_resolver

    def walk(patterns, prefix=""):
        for pattern in patterns:
            route = prefix + str(pattern.pattern)
            if isinstance(pattern, URLResolver):
                yield from walk(pattern.url_patterns, route)
            elif isinstance(pattern, URLPattern):
                yield route

    paths = set()
    for route in walk(get_resolver().url_patterns):
        route = route.replace("^", "").replace("$", "")
        route = re.sub(r"\(\?P<(\w+)>[^)]*\)", r"{\1}", route)
        route = re.sub(r"<(?:\w+:)?(\w+)>", r"{\1}", route)
        if route.startswith(("api/v2/", "v1/")):
            paths.add("/" + route)
    return paths


def test_the_schema_describes_every_route_served_the_v1_ones_and_the_deadline_header_included(db):
    schema = _schema()
    served = _served_paths()
    assert {"/v1/chat/completions", "/v1/models/{model_id}", "/api/v2/find_user"} <= served
    assert served <= set(schema["paths"]), served - set(schema["paths"])
    for path in ("/v1/chat/completions", "/v1/responses", "/v1/messages"):
        operation = schema["paths"][path]["post"]
        assert "X-MultiLLM-Deadline-Ms" in [p["name"] for p in operation["parameters"]]
        assert operation["security"] == [{"bearer": []}, {"x-api-key": []}]
        assert "requestBody" in operation
    async_operation = schema["paths"]["/api/v2/generate/text/async"]["post"]
    assert "X-MultiLLM-Deadline-Ms" in [p["name"] for p in async_operation["parameters"]]


def test_only_the_routes_that_need_a_key_declare_one(db):
    paths = _schema()["paths"]
    assert "security" not in paths["/api/v2/status/heartbeat"]["get"]
    assert "security" not in paths["/api/v2/generate/text/status/{request_id}"]["get"]
    assert "security" not in paths["/api/v2/status/models"]["get"]
    for path, method in (("/api/v2/generate/text/pop", "post"), ("/api/v2/find_user", "get")):
        assert paths[path][method]["security"] == [{"apikey": []}]
    assert paths["/api/v2/workers"]["get"]["security"] == [{}, {"apikey": []}]


def test_the_schema_refuses_the_bodies_the_server_refuses(requester, owner):
    import jsonschema

    schema = _schema()
    components = schema["components"]["schemas"]

    def schema_accepts(component: str, body: dict) -> bool:
        resolver = {"$ref": f"#/components/schemas/{component}", "components": schema["components"]}
        try:
            jsonschema.validate(body, resolver)
        except jsonschema.ValidationError:
            return False
        return True

    assert components  # the components the bodies are checked against
    owner.pop("w", models=["m1"])
    cases = [
        ("PopInput", "/api/v2/generate/text/pop", {"name": "", "models": ["m1"]}),
        ("PopInput", "/api/v2/generate/text/pop", {"name": "w", "models": [""]}),
        ("TextAsyncInput", "/api/v2/generate/text/async", {"prompt": ""}),
        ("TextAsyncInput", "/api/v2/generate/text/async", {"prompt": "hi", "params": {"sampler_order": []}}),
    ]
    for component, path, body in cases:
        caller = owner if path.endswith("pop") else requester
        assert caller.post(path, body).status_code == 400, body
        assert not schema_accepts(component, body), body
    # And what both accept.
    assert schema_accepts("PopInput", {"name": "w", "models": ["m1"]})
    assert schema_accepts(
        "TextAsyncInput", {"prompt": "hi", "params": {"sampler_order": [6, 0, 1, 3, 4, 2, 5]}}
    )


def test_the_schemas_non_blank_pattern_refuses_exactly_what_drf_trims_to_nothing():
    field = StrictCharField()
    for code in [*range(0x3001), 0xFEFF, 0x200B, 0x10FFFF]:
        text = chr(code)
        try:
            field.run_validation(text)
            kept = True
        except ValidationError:
            kept = False
        assert bool(re.search(NOT_ONLY_WHITE_SPACE, text)) == kept or code == 0, hex(code)


def _accepts(schema: dict, body: object, component: str | None = None, path: str | None = None) -> bool:
    import jsonschema

    if path is not None:
        target = schema["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]
    else:
        target = {"$ref": f"#/components/schemas/{component}"}
    try:
        jsonschema.validate(body, {**target, "components": schema["components"]})
    except jsonschema.ValidationError:
        return False
    return True


def test_count_tokens_needs_no_max_tokens_in_the_schema_as_on_the_route(requester):
    schema = _schema()
    body = {"model": "m1", "messages": [{"role": "user", "content": "Hello there"}]}
    counted = requester.client.post(
        "/v1/messages/count_tokens", body, format="json", HTTP_AUTHORIZATION=f"Bearer {requester.api_key}"
    )
    assert counted.status_code == 200, counted.content
    assert _accepts(schema, body, path="/v1/messages/count_tokens")
    assert not _accepts(schema, body, path="/v1/messages")  # Messages itself needs max_tokens


def test_the_schema_refuses_a_nul_or_a_string_past_the_body_limit_in_a_body(requester, settings):
    schema = _schema()
    body = {"model": "m1", "messages": [{"role": "user", "content": "Hello there"}]}
    nul = {**body, "messages": [{"role": "user", "content": "Hel\x00lo"}]}
    refused = requester.client.post(
        "/v1/messages/count_tokens", nul, format="json", HTTP_AUTHORIZATION=f"Bearer {requester.api_key}"
    )
    assert refused.status_code == 400
    assert not _accepts(schema, {**body, "model": "m\x00"}, path="/v1/messages/count_tokens")
    assert not _accepts(schema, {**body, "stop_sequences": ["a\x00"]}, path="/v1/messages/count_tokens")
    assert not _accepts(schema, {"prompt": "a\x00b"}, component="TextAsyncInput")
    huge = "x" * (settings.MAX_REQUEST_BODY_BYTES + 1)
    assert not _accepts(schema, {"prompt": huge}, component="TextAsyncInput")
    assert not _accepts(schema, {**body, "system": huge}, path="/v1/messages/count_tokens")
    assert _accepts(schema, {"prompt": "a b"}, component="TextAsyncInput")
