"""What the logs say about expected outcomes: a deadline's 504 is INFO, not Django's ERROR, and a
refused host one WARNING line, not a traceback."""

import logging

import pytest

from jobs.deadlines import HEADER
from tests.hordeops.test_connection_wait import _answer_in_a_thread, _async_text, every_connection_taken

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_deadline_504_is_logged_at_info_with_its_code_and_no_prompt(make_caller, caplog):
    caplog.set_level(logging.INFO)
    post = _async_text(make_caller, **{f"HTTP_{HEADER.upper().replace('-', '_')}": "300"})
    with every_connection_taken():  # the deadline runs out waiting for a connection
        status, _, body = _answer_in_a_thread(post)
    assert (status, body["rc"]) == (504, "generation_deadline_exceeded")
    logged = [r for r in caplog.records if r.name == "django.request"]
    assert [(r.levelname, r.getMessage()) for r in logged] == [
        ("INFO", "POST /api/v2/generate/text/async: generation_deadline_exceeded (504)")
    ]
    assert not any("Once upon a time" in r.getMessage() for r in caplog.records)


def test_other_server_errors_are_still_logged_as_errors(caplog):
    from django.test import RequestFactory

    from hordeops.logs import ExpectedOutcomes

    record = logging.LogRecord(
        "django.request", logging.ERROR, __file__, 1, "Service Unavailable: %s", ("/x",), None
    )
    record.status_code, record.request = 503, RequestFactory().get("/x")
    assert ExpectedOutcomes().filter(record) and (record.levelname, record.getMessage()) == (
        "ERROR",
        "Service Unavailable: /x",
    )


def test_a_refused_host_is_one_warning_line_with_no_traceback(client, caplog):
    caplog.set_level(logging.INFO)
    answer = client.get("/api/v2/status/heartbeat", HTTP_HOST="attacker.example" + "x" * 500)
    assert answer.status_code == 400
    [record] = [r for r in caplog.records if r.name == "django.security.DisallowedHost"]
    assert (record.levelname, record.exc_info) == ("WARNING", None)
    assert record.getMessage().startswith("request for a host this horde does not serve: 'attacker.example")
    assert len(record.getMessage()) < 200
