"""Waiting for a pooled database connection is bounded: by DATABASE_POOL_WAIT_SECONDS (an
outage or an exhausted pool answers 503 that soon, not after the pool's own timeout) and by
the request's generation deadline (its 504, within a few hundred milliseconds)."""

import threading
import time
from contextlib import contextmanager

import pytest
from django.db import connection, connections
from psycopg_pool import PoolTimeout
from rest_framework.test import APIClient

from jobs.deadlines import HEADER

pytestmark = pytest.mark.django_db(transaction=True)


@contextmanager
def every_connection_taken():
    """Hold every connection the pool can give, so that the next request must wait."""
    pool = connection.pool
    pool.open()
    held = []
    try:
        while True:
            try:
                held.append(pool.getconn(timeout=0.3))
            except PoolTimeout:
                break
        yield len(held)
    finally:
        for conn in held:
            pool.putconn(conn)


def _answer_in_a_thread(post) -> tuple[int, float, dict]:
    """Run `post` on a thread of its own (a connection of its own) and time its answer."""
    result = {}

    def run() -> None:
        started = time.monotonic()
        try:
            response = post()
            result["answer"] = (response.status_code, time.monotonic() - started, response.json())
        finally:
            connections.close_all()

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(timeout=30)
    return result["answer"]


def _async_text(make_caller, **headers):
    caller = make_caller("waits-requester")
    client = APIClient()
    return lambda: client.post(
        "/api/v2/generate/text/async",
        {"prompt": "Once upon a time", "models": ["m1"]},
        format="json",
        HTTP_APIKEY=caller.api_key,
        **headers,
    )


def test_a_request_with_no_connection_to_be_had_is_answered_503_after_the_pool_wait(make_caller, settings):
    settings.DATABASE_POOL_WAIT_SECONDS = 0.5
    post = _async_text(make_caller)
    with every_connection_taken() as held:
        assert held > 0
        status, seconds, body = _answer_in_a_thread(post)
    assert status == 503, body
    assert body["rc"] == "ServiceUnavailable"
    assert 0.4 < seconds < 2.0


def test_a_deadline_shorter_than_the_pool_wait_is_kept_while_waiting_for_a_connection(make_caller, settings):
    settings.DATABASE_POOL_WAIT_SECONDS = 5
    post = _async_text(make_caller, **{"HTTP_" + HEADER.upper().replace("-", "_"): "600"})
    with every_connection_taken():
        status, seconds, body = _answer_in_a_thread(post)
    assert status == 504, body
    assert body["rc"] == "generation_deadline_exceeded"
    assert seconds < 0.6 + 0.4


def test_a_chat_request_waiting_for_a_connection_keeps_its_deadline_and_frees_its_thread(
    make_caller, settings
):
    settings.DATABASE_POOL_WAIT_SECONDS = 5
    caller = make_caller("waits-chat")
    client = APIClient()

    def post():
        return client.post(
            "/v1/chat/completions",
            {"model": "m1", "messages": [{"role": "user", "content": "hi"}]},
            format="json",
            HTTP_AUTHORIZATION=f"Bearer {caller.api_key}",
            **{"HTTP_" + HEADER.upper().replace("-", "_"): "600"},
        )

    with every_connection_taken():
        status, seconds, body = _answer_in_a_thread(post)
    assert status == 504, body
    assert body["error"]["code"] == "generation_deadline_exceeded"
    assert seconds < 0.6 + 0.4


def test_a_wait_that_finds_a_connection_in_time_is_served(make_caller, settings):
    settings.DATABASE_POOL_WAIT_SECONDS = 5
    post = _async_text(make_caller, **{"HTTP_" + HEADER.upper().replace("-", "_"): "3000"})
    with every_connection_taken():
        pass
    status, _, body = _answer_in_a_thread(post)
    assert status == 202, body


def test_a_pooled_connection_whose_backend_ended_is_told_from_a_live_one_without_a_query():
    import psycopg

    from hordeops.db.base import is_open

    pool = connection.pool
    pool.open()
    conn = pool.getconn(timeout=5)
    try:
        assert is_open(conn)  # a live idle one
        pid = conn.info.backend_pid
        with psycopg.connect(conn.info.dsn, autocommit=True) as other:
            assert other.execute("SELECT pg_terminate_backend(%s)", [pid]).fetchone() == (True,)
        ended_by = time.monotonic() + 5
        while is_open(conn) and time.monotonic() < ended_by:
            time.sleep(0.01)
        assert not is_open(conn)
    finally:
        conn.close()
        pool.putconn(conn)
    # The pool replaces it: the next request is served.
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
        assert cursor.fetchone() == (1,)
