"""The OpenAPI schema at /api/schema/ is valid and covers every route."""

import yaml
from openapi_spec_validator import validate
from rest_framework.test import APIClient


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
