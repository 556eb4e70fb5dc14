"""psycopg's cache of parsed statements holds the pop's, which is over its default bound."""

from django.db import connection
from django.test.utils import CaptureQueriesContext
from psycopg import _queries

from jobs import sql


def _parsed_afresh(caller) -> tuple[int, int]:
    """A pop's statements, and how many of them psycopg parsed afresh rather than from its cache."""
    before = _queries._query2pg.cache_info()
    with CaptureQueriesContext(connection) as statements:
        answer = caller.pop("cached")
    assert answer.status_code == 200
    after = _queries._query2pg.cache_info()
    assert any("jobs_queuedmodel" in statement["sql"] for statement in statements.captured_queries)
    return len(statements), len(statements) - (after.hits - before.hits) + (after.misses - before.misses)


def test_every_statement_of_a_pop_is_parsed_from_psycopgs_cache_the_long_pop_included(owner, requester):
    assert len(sql.claim().encode()) > 4096  # psycopg's own bound: the pop's would be parsed each time
    owner.pop("cached")  # an empty pop: its statements seen once
    assert _parsed_afresh(owner) == (3, 0)  # the check-in, the pop, why it found nothing
    for _ in range(2):
        assert requester.request_text(models=["m1"]).status_code == 202
    owner.pop("cached")  # a pop that finds a job: its statements seen once
    assert _parsed_afresh(owner) == (2, 0)  # the check-in, the pop
