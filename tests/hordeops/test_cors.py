"""CORS on the public APIs (`/api/v2/`, `/v1/`): any origin, no credentials, the clients' headers
allowed and the retry headers exposed; never on the admin, /metrics or the schema."""

import pytest
from django.test import Client
from django_redis import get_redis_connection

PAGE = "https://lite.example"
# What a browser's preflight for the openai SDK's streamed chat call asks for.
SDK_HEADERS = "authorization,content-type,x-stainless-os,x-stainless-retry-count,x-multillm-deadline-ms"


def _preflight(path: str, method: str = "POST", headers: str = "apikey,content-type,client-agent"):
    return Client().options(
        path,
        headers={
            "origin": PAGE,
            "access-control-request-method": method,
            "access-control-request-headers": headers,
        },
    )


def _allowed(response) -> set[str]:
    return {name.strip() for name in response.headers["access-control-allow-headers"].split(",")}


@pytest.mark.parametrize(
    "path",
    ["/api/v2/generate/text/async", "/api/v2/generate/text/status/x", "/v1/chat/completions", "/v1/messages"],
)
def test_a_preflight_on_the_public_apis_allows_any_origin_and_the_clients_headers(db, path):
    answer = _preflight(path)
    assert answer.status_code == 200
    assert answer.headers["access-control-allow-origin"] == "*"
    assert "access-control-allow-credentials" not in answer.headers
    assert {"POST", "GET", "DELETE", "PUT"} <= set(answer.headers["access-control-allow-methods"].split(", "))
    wanted = {
        "apikey",
        "client-agent",
        "authorization",
        "x-api-key",
        "anthropic-version",
        "x-multillm-deadline-ms",
    }
    assert wanted | set(SDK_HEADERS.split(",")) <= _allowed(answer)


def test_an_answer_to_a_page_carries_the_origin_and_exposes_the_retry_headers(db):
    answer = Client().get("/api/v2/status/performance", headers={"origin": PAGE})
    assert answer.status_code == 200
    assert answer.headers["access-control-allow-origin"] == "*"
    assert set(answer.headers["access-control-expose-headers"].split(", ")) == {
        "retry-after",
        "x-should-retry",
    }


def test_a_refusal_is_readable_by_the_page_too(db, requester, owner, settings):
    settings.KEY_RATE_PER_SECOND, settings.KEY_RATE_BURST = 1, 1
    settings.TRUSTED_PROXIES = ()
    for key in get_redis_connection("default").scan_iter("hordeops:rate:*"):
        get_redis_connection("default").delete(key)
    owner.pop("w", models=["m1"])
    body = {"prompt": "hi", "models": ["m1"]}
    answers = [requester.post("/api/v2/generate/text/async", body, HTTP_ORIGIN=PAGE) for _ in range(3)]
    refused = answers[-1]
    assert (refused.status_code, refused.json()["rc"]) == (429, "RateLimited")
    assert refused.headers["access-control-allow-origin"] == "*"
    unknown = Client().post("/v1/completions-nowhere", headers={"origin": PAGE})
    assert unknown.headers["access-control-allow-origin"] == "*"


@pytest.mark.parametrize("path", ["/admin/login/", "/metrics", "/api/schema/"])
def test_the_admin_metrics_and_schema_send_no_cors_headers(db, path):
    answer = Client().get(path, headers={"origin": PAGE})
    assert "access-control-allow-origin" not in answer.headers
    preflight = _preflight(path, method="GET")
    assert "access-control-allow-origin" not in preflight.headers


def test_the_origins_can_be_narrowed_to_a_list(db, settings):
    settings.CORS_ALLOWED_ORIGINS = [PAGE]
    settings.CORS_ALLOW_ALL_ORIGINS = False
    listed = _preflight("/v1/chat/completions", headers=SDK_HEADERS)
    assert listed.headers["access-control-allow-origin"] == PAGE
    other = Client().get("/api/v2/status/performance", headers={"origin": "https://elsewhere.example"})
    assert "access-control-allow-origin" not in other.headers


def test_a_page_may_send_an_idempotency_key_with_a_kudos_transfer(db):
    answer = _preflight("/api/v2/kudos/transfer", headers="apikey,content-type,idempotency-key")
    assert answer.status_code == 200
    assert "idempotency-key" in _allowed(answer)
