"""A request's hold (`kudos.models.Hold`): placed by the statement that queues it, drawn down as
its generations are charged, released by every way it can leave `active`; and held to the
requests by `check_kudos`."""

from decimal import Decimal

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from jobs.models import Ending, TextRequest
from jobs.services import abort_stale_generations, cancel_request
from kudos import holds
from kudos.models import Hold
from tests.conftest import give_kudos

T0 = "2026-03-01 12:00:00+00:00"


def _queue(requester, n: int = 1) -> TextRequest:
    answer = requester.request_text(models=["m1"], params={"max_length": 80, "n": n})
    assert answer.status_code == 202, answer.content
    return TextRequest.objects.get(pk=answer.json()["id"])


def _held(request: TextRequest) -> Decimal | None:
    return Hold.objects.filter(request_id=request.pk).values_list("amount", flat=True).first()


def test_queueing_places_a_hold_of_the_requests_cost_and_a_refused_request_none(requester, clock):
    request = _queue(requester)
    hold = Hold.objects.get()
    assert (hold.request_id, hold.account_id) == (request.pk, requester.account.pk)
    assert hold.amount == request.kudos_reserved > 0
    refused = requester.request_text(params={"max_length": 600, "max_context_length": 2048})
    assert refused.json()["rc"] == "KudosUpfront"
    assert Hold.objects.count() == 1
    call_command("check_kudos")


def test_the_hold_is_placed_in_the_one_statement_that_queues(
    requester, owner, clock, django_assert_num_queries
):
    owner.pop("w")
    _queue(requester)  # what a process reads once (the model table, the horde's modes)
    # The key's account; the account's lock and the statement that counts, inserts, holds and
    # pays the tax (in the test's savepoint); the workers that may be offered it.
    with django_assert_num_queries(6):
        answer = requester.request_text(models=["m1"], params={"max_length": 80})
    request = TextRequest.objects.get(pk=answer.json()["id"])
    assert _held(request) == request.kudos_reserved


def test_a_charged_generation_draws_the_hold_down_and_the_last_submit_releases_it(
    requester, trusted_owner, clock
):
    give_kudos(requester, "1000")
    trusted_owner.pop("w")
    request = _queue(requester, n=2)
    first = trusted_owner.pop("w").json()["id"]
    trusted_owner.submit(first, "y" * 100)
    request.refresh_from_db()
    assert request.kudos_spent > 0
    assert _held(request) == request.kudos_reserved - request.kudos_spent
    call_command("check_kudos")
    second = trusted_owner.pop("w").json()["id"]
    trusted_owner.submit(second, "y" * 100)
    request.refresh_from_db()
    assert (request.state, _held(request)) == (TextRequest.State.DONE, None)
    call_command("check_kudos")


def test_a_cancelled_request_releases_its_hold(requester, owner, clock):
    owner.pop("w")
    request = _queue(requester)
    owner.pop("w")  # one in a worker's hands, cancelled with it
    cancel_request(request_id=request.pk)
    assert (TextRequest.objects.get(pk=request.pk).state, _held(request)) == (
        TextRequest.State.CANCELLED,
        None,
    )
    call_command("check_kudos")


def test_a_request_the_stale_pass_expires_releases_its_hold(requester, clock):
    request = _queue(requester)
    clock.shift(1201)
    abort_stale_generations()
    assert (TextRequest.objects.get(pk=request.pk).state, _held(request)) == (TextRequest.State.EXPIRED, None)
    call_command("check_kudos")


def test_a_request_expired_as_its_status_is_read_releases_its_hold(requester, clock):
    request = _queue(requester)
    clock.shift(1201)
    assert requester.status(request.pk).json()["faulted"] is True
    assert (TextRequest.objects.get(pk=request.pk).state, _held(request)) == (TextRequest.State.EXPIRED, None)


def test_a_request_faulted_past_its_restarts_releases_its_hold(requester, owner, clock, settings):
    settings.TEXT_REQUEST_MAX_RESTARTS = 1
    owner.pop("w")
    request = _queue(requester)
    owner.pop("w")
    clock.shift(151)  # past the lease: aborted, and the one restart allowed is spent
    abort_stale_generations()
    request.refresh_from_db()
    assert (request.state, request.ending, _held(request)) == (
        TextRequest.State.FAULTED,
        Ending.RESTARTS,
        None,
    )
    call_command("check_kudos")


def test_a_restarted_request_keeps_its_hold(requester, owner, clock):
    owner.pop("w")
    request = _queue(requester)
    owner.pop("w")
    clock.shift(151)
    abort_stale_generations()
    assert _held(request) == request.kudos_reserved
    call_command("check_kudos")


def test_check_kudos_reports_holds_that_disagree_with_their_requests(requester, clock):
    request = _queue(requester)
    Hold.objects.filter(request_id=request.pk).update(amount=Decimal(1))
    with pytest.raises(CommandError, match="1 hold"):
        call_command("check_kudos")
    Hold.objects.all().delete()  # an active request with no hold
    assert len(holds.disagreements()) == 1
    cancel_request(request_id=request.pk)
    Hold.objects.create(request_id=request.pk, account=requester.account, amount=Decimal(1))
    assert len(holds.disagreements()) == 1  # a hold for a request that ended
    Hold.objects.all().delete()
    call_command("check_kudos")


def test_the_migration_holds_what_the_requests_active_then_still_hold(requester, clock):
    active, ended = _queue(requester), _queue(requester)
    TextRequest.objects.filter(pk=active.pk).update(kudos_spent=Decimal(5))
    cancel_request(request_id=ended.pk)
    Hold.objects.all().delete()  # as before the migration: no holds
    # The deferred checks of the rows above run now: a later migration's ALTER TABLE, undone
    # on the way back, cannot run with them pending.
    with connection.cursor() as cursor:
        cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
    executor = MigrationExecutor(connection)
    latest = executor.loader.graph.leaf_nodes("jobs")
    executor.migrate([("jobs", "0021_generation_relayed_bytes")])
    executor.loader.build_graph()
    executor.migrate([("jobs", "0022_holds_of_active_requests")])
    assert list(Hold.objects.values_list("request_id", "amount")) == [(active.pk, active.kudos_reserved - 5)]
    executor.loader.build_graph()
    executor.migrate(latest)  # the later migrations back, for the tests after this one
