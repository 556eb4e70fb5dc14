"""PostgreSQL stopped (`pg_ctl -m immediate`, as a crash) under open chat requests, on a
cluster of the test's own: a committed stream ends with its protocol's error event within
seconds, a waiting request is answered 503, the horde routes answer 503 within the pool's
wait (a deadline within itself), and once the database is back every request whose requester
was told is cancelled (the cancellation waited for it) and the horde serves again. And the
database failing just as a stream commits (a trigger on the test database fails that one
statement) is a 503, not a 500."""

import json
import time

import httpx
import pytest

from jobs.models import Generation, TextRequest
from tests.jobs.test_redis_faults import BODIES, ENDINGS, ERROR_MARKS, MODEL
from tests.live import Background, ChatWorker, committed_stream_cut

WAIT_SECONDS = 30
# How soon after the stop the requester must be told (the watch asks once a second).
TOLD_WITHIN_SECONDS = 5
# How soon after the restart the waiting cancellations must be made.
MADE_WITHIN_SECONDS = 15
# The pool's wait (DATABASE_POOL_WAIT_SECONDS, 2) with room for a slow machine.
ANSWERED_WITHIN_SECONDS = 3.5


def _state(private_postgres, model, pk) -> str:
    [(state,)] = private_postgres.sql(f"SELECT state FROM {model._meta.db_table} WHERE id = %s", (pk,))
    return state


def _eventually(check, what: str, timeout: float = MADE_WITHIN_SECONDS) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"not within {timeout} s: {what}"
        time.sleep(0.2)


@pytest.mark.parametrize("live_stack", [1], indirect=True)
@pytest.mark.parametrize("path", list(BODIES))
def test_a_committed_stream_ends_with_an_error_event_when_postgresql_dies(private_postgres, live_stack, path):
    [url] = live_stack.urls
    requester_key = private_postgres.create_account("pg-requester")
    worker = ChatWorker(url, private_postgres.create_account("pg-owner"), name="pg-worker", model=MODEL)
    worker.pop()
    tail, told_after, generation_id = committed_stream_cut(
        url, requester_key, worker, path, BODIES[path], private_postgres.stop
    )
    assert ERROR_MARKS[path] in tail and "lost its database" in tail, tail
    assert not any(ending in tail for ending in ENDINGS), tail
    assert told_after < TOLD_WITHIN_SECONDS

    private_postgres.start()
    _eventually(
        lambda: _state(private_postgres, Generation, generation_id) == Generation.State.CANCELLED,
        "the generation cancelled",
    )
    [(request_id,)] = private_postgres.sql(
        f"SELECT request_id FROM {Generation._meta.db_table} WHERE id = %s", (generation_id,)
    )
    assert _state(private_postgres, TextRequest, request_id) == TextRequest.State.CANCELLED
    after = worker.progress(" more")
    assert (after.status_code, after.json()["rc"]) == (409, "GenerationCancelled")


@pytest.mark.parametrize("live_stack", [1], indirect=True)
def test_a_waiting_request_is_answered_503_when_postgresql_dies_and_cancelled_once_it_is_back(
    private_postgres, live_stack
):
    [url] = live_stack.urls
    requester_key = private_postgres.create_account("pg-requester")
    owner_key = private_postgres.create_account("pg-owner")
    ChatWorker(url, owner_key, name="pg-worker", model=MODEL).pop()  # known, but serving nothing
    headers = {"Authorization": f"Bearer {requester_key}"}

    def ask() -> tuple[httpx.Response, float]:
        with httpx.Client(base_url=url, headers=headers, timeout=WAIT_SECONDS) as http:
            answer = http.post(
                "/v1/chat/completions", json={**BODIES["/v1/chat/completions"], "stream": False}
            )
            return answer, time.monotonic()

    asking = Background(ask)
    table = TextRequest._meta.db_table
    _eventually(lambda: private_postgres.sql(f"SELECT count(*) FROM {table}") == [(1,)], "the request queued")
    time.sleep(0.3)  # the requester now waits on the relay
    private_postgres.stop()
    stopped = time.monotonic()
    answer, answered = asking.result()
    assert answered - stopped < TOLD_WITHIN_SECONDS
    assert answer.status_code == 503, answer.text
    assert answer.headers["x-should-retry"] == "false"
    error = json.loads(answer.text)["error"]
    assert error["code"] == "service_unavailable" and "lost its database" in error["message"]

    private_postgres.start()
    _eventually(
        lambda: private_postgres.sql(f"SELECT state, queued FROM {table}")
        == [(TextRequest.State.CANCELLED, 0)],
        "the request cancelled",
    )


@pytest.mark.parametrize("live_stack", [1], indirect=True)
def test_the_horde_routes_answer_at_once_while_postgresql_is_down_and_serve_once_it_is_back(
    private_postgres, live_stack
):
    [url] = live_stack.urls
    key = private_postgres.create_account("pg-owner")
    worker = ChatWorker(url, key, name="pg-worker", model=MODEL)
    worker.pop()
    private_postgres.stop()
    with httpx.Client(base_url=url, headers={"apikey": key}, timeout=WAIT_SECONDS) as http:

        def timed(method: str, path: str, **kwargs) -> tuple[httpx.Response, float]:
            started = time.monotonic()
            answer = http.request(method, path, **kwargs)
            return answer, time.monotonic() - started

        heartbeat, seconds = timed("GET", "/api/v2/status/heartbeat")
        assert (heartbeat.status_code, heartbeat.json()["message"]) == (503, "Cannot reach PostgreSQL.")
        assert seconds < ANSWERED_WITHIN_SECONDS
        for path, body in [
            ("/api/v2/generate/text/pop", {"name": "pg-worker", "models": [MODEL]}),
            ("/api/v2/generate/text/async", {"prompt": "Once upon a time", "models": [MODEL]}),
        ]:
            answer, seconds = timed("POST", path, json=body)
            assert (answer.status_code, answer.json()["rc"]) == (503, "ServiceUnavailable"), path
            assert answer.headers["x-should-retry"] == "false"
            assert seconds < ANSWERED_WITHIN_SECONDS, path
        late, seconds = timed(
            "POST",
            "/api/v2/generate/text/async",
            json={"prompt": "Once upon a time", "models": [MODEL]},
            headers={"X-MultiLLM-Deadline-Ms": "500"},
        )
        assert (late.status_code, late.json()["rc"]) == (504, "generation_deadline_exceeded")
        assert seconds < 0.5 + 0.4

        # A worker keeps polling through a longer outage (the pool keeps failing to connect).
        pop = {"name": "pg-worker", "models": [MODEL]}
        polling_until = time.monotonic() + 8
        while time.monotonic() < polling_until:
            assert http.post("/api/v2/generate/text/pop", json=pop).status_code == 503
            time.sleep(0.5)

        private_postgres.start()
        # Served at once: no connection the restart closed, no reconnection still backing off.
        assert http.get("/api/v2/status/heartbeat").status_code == 200
        queued = http.post(
            "/api/v2/generate/text/async", json={"prompt": "Once upon a time", "models": [MODEL]}
        )
        assert queued.status_code == 202, queued.text
        job = http.post("/api/v2/generate/text/pop", json=pop)
        assert job.status_code == 200 and job.json()["id"], job.text


# The one statement that sets `streamed` (jobs/services/requests.py commit_stream) fails as a
# connection lost does (SQLSTATE class 08): the database failing just as a stream commits,
# which the fault run met while the primary failed over.
FAIL_THE_COMMIT = """
CREATE FUNCTION test_fail_the_stream_commit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN RAISE EXCEPTION 'the connection was lost' USING ERRCODE = '08006'; END $$;
CREATE TRIGGER test_fail_the_stream_commit BEFORE UPDATE OF streamed ON jobs_generation
FOR EACH ROW WHEN (NEW.streamed AND NOT OLD.streamed) EXECUTE FUNCTION test_fail_the_stream_commit();
"""


@pytest.mark.parametrize("live_stack", [1], indirect=True)
def test_a_database_failure_as_a_stream_commits_is_answered_503_and_its_job_cancelled(
    live_stack, make_caller
):
    from django.db import connection

    [url] = live_stack.urls
    requester, owner = make_caller("commit-requester"), make_caller("commit-owner")
    worker = ChatWorker(url, owner.api_key, name="commit-w", model=MODEL)
    assert worker.pop()["id"] is None  # checks in with its model
    with connection.cursor() as cursor:
        cursor.execute(FAIL_THE_COMMIT)
    try:
        first_words = Background(lambda: (worker.pop_job(), worker.progress("Hello").status_code))
        answer = httpx.post(
            f"{url}/v1/chat/completions",
            json=BODIES["/v1/chat/completions"],
            headers={"Authorization": f"Bearer {requester.api_key}"},
            timeout=WAIT_SECONDS,
        )
        assert first_words.result()[1] == 200
    finally:
        with connection.cursor() as cursor:
            cursor.execute("DROP FUNCTION test_fail_the_stream_commit() CASCADE")
    assert answer.status_code == 503, answer.text  # it was a 500
    assert answer.json()["error"]["code"] == "service_unavailable"
    # Nothing will read the job's output: its cancellation, deferred, is made, and the worker told.
    _eventually(lambda: worker.progress(" more").status_code == 409, "the worker told GenerationCancelled")
    assert TextRequest.objects.get().ending == "ServiceUnavailable"
