"""The stack behind Debian's PgBouncer in transaction mode (tests/live.py `PgBouncer`): with
DATABASE_PREPARE_THRESHOLD empty it prepares no statement and serves every route; with the
threshold it ships with, statements prepared on one server connection are missing on the next."""

import httpx
import psycopg
import pytest

pytestmark = pytest.mark.parametrize("live_stack", [1], indirect=True)

ROUNDS = 12  # every hot statement run more than the shipped threshold (5) times


def _serve_rounds(base_url: str, requester_key: str, owner_key: str) -> list[str]:
    """Queue, pop, submit and poll ROUNDS times; the answers that were not a success."""
    failures = []
    with httpx.Client(base_url=base_url, timeout=15) as client:
        for n in range(ROUNDS):
            queued = client.post(
                "/api/v2/generate/text/async",
                headers={"apikey": requester_key},
                json={"prompt": f"Round {n}", "models": ["m1"]},
            )
            job = client.post(
                "/api/v2/generate/text/pop",
                headers={"apikey": owner_key},
                json={"name": "pooled", "models": ["m1"]},
            )
            answers = [queued, job]
            if job.status_code == 200 and job.json().get("id"):
                answers.append(
                    client.post(
                        "/api/v2/generate/text/submit",
                        headers={"apikey": owner_key},
                        json={"id": job.json()["id"], "generation": "Done."},
                    )
                )
            if queued.status_code == 202:
                answers.append(client.get(f"/api/v2/generate/text/status/{queued.json()['id']}"))
            failures += [f"{a.request.url.path} {a.status_code}" for a in answers if a.status_code >= 400]
    return failures


@pytest.mark.live_env(DATABASE_PREPARE_THRESHOLD="")
def test_behind_pgbouncer_in_transaction_mode_no_statement_is_prepared_and_every_route_serves(
    pgbouncer, live_stack, make_caller
):
    requester, owner = make_caller("pooled-requester"), make_caller("pooled-owner")
    assert _serve_rounds(live_stack.urls[0], requester.api_key, owner.api_key) == []
    live_stack.assert_alive()
    # The database's own setting holds where the connection's `options` were dropped.
    with psycopg.connect(pgbouncer.url(), autocommit=True, prepare_threshold=None) as conn:
        assert conn.execute("SHOW jit").fetchone() == ("off",)
        assert conn.execute("SELECT count(*) FROM pg_prepared_statements").fetchone() == (0,)


@pytest.mark.live_env(DATABASE_PREPARE_THRESHOLD="5")
def test_behind_pgbouncer_the_shipped_threshold_loses_its_prepared_statements(
    pgbouncer, live_stack, make_caller
):
    requester, owner = make_caller("pooled-requester"), make_caller("pooled-owner")
    failures = _serve_rounds(live_stack.urls[0], requester.api_key, owner.api_key)
    assert any(failure.endswith(" 503") for failure in failures), failures
    # 42P05: a name prepared on this server connection by another client; 26000: one prepared
    # on another server connection, missing here.
    output = live_stack.output()
    assert "ProgrammingError 42P05" in output or "26000" in output, output
