"""`GET /api/v2/status/heartbeat`: 200 when PostgreSQL and Redis answer, 503 otherwise."""

import copy

import pytest
from django.db import connection
from rest_framework.test import APIClient


def test_it_answers_ok_when_postgresql_and_redis_answer(db):
    answer = APIClient().get("/api/v2/status/heartbeat")
    assert answer.status_code == 200
    assert answer.json()["message"] == "OK"


def test_it_answers_503_when_redis_is_unreachable(db, settings):
    settings.CACHES = {
        "default": {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": "redis://127.0.0.1:1/0",  # nothing listens on port 1
            "OPTIONS": {"SOCKET_CONNECT_TIMEOUT": 0.5, "SOCKET_TIMEOUT": 0.5},
        }
    }
    answer = APIClient().get("/api/v2/status/heartbeat")
    assert answer.status_code == 503
    assert answer.json() == {"message": "Cannot reach Redis.", "rc": "ServiceUnavailable"}


@pytest.mark.django_db(transaction=True)
def test_it_answers_503_when_postgresql_is_unreachable():
    saved = copy.deepcopy(connection.settings_dict)
    connection.close()
    connection.close_pool()  # the next connection comes from a new pool, on the new port
    connection.settings_dict["PORT"] = "1"  # nothing listens on port 1
    connection.settings_dict["OPTIONS"]["pool"] = {**saved["OPTIONS"]["pool"], "min_size": 0, "timeout": 1}
    try:
        answer = APIClient().get("/api/v2/status/heartbeat")
    finally:
        connection.close()
        connection.close_pool()
        connection.settings_dict.clear()
        connection.settings_dict.update(saved)
    assert answer.status_code == 503
    assert answer.json() == {"message": "Cannot reach PostgreSQL.", "rc": "ServiceUnavailable"}
