"""Moderators' messages to a worker reach it in its pops' `messages`, in the AI Horde's shape."""

from datetime import timedelta

from workers.models import Worker, WorkerMessage

T0 = "2026-06-01 12:00:00+00:00"


def test_a_moderators_message_reaches_the_worker_in_each_pop_until_it_expires(
    clock, moderator, owner, requester, make_caller
):
    owner.pop("told")
    other = make_caller()
    other.pop("untold")
    worker = Worker.objects.get(name="told")
    sent = moderator.post(
        "/admin/workers/workermessage/add/",
        {
            "worker": str(worker.pk),
            "message": "Your replies are cut short: check your backend.",
            "origin": "Mods",
            "hours": "2",
        },
    )
    assert sent.status_code == 302, sent.content
    row = WorkerMessage.objects.get()
    assert row.created_by == "mod"

    [message] = owner.pop("told").json()["messages"]
    assert message == {
        "id": str(row.pk),
        "message": "Your replies are cut short: check your backend.",
        "origin": "Mods",
        "expiry": "Mon, 01 Jun 2026 14:00:00 -0000",
    }
    assert other.pop("untold").json()["messages"] == []
    requester.request_text()
    job = owner.pop("told").json()
    assert job["id"] is not None and job["messages"] == [message]

    clock.shift(timedelta(hours=2))
    assert owner.pop("told").json()["messages"] == []


def test_a_deleted_message_stops_at_once_and_messages_cost_the_pop_no_statement(
    clock, moderator, owner, requester, django_assert_num_queries
):
    owner.pop("w")
    worker = Worker.objects.get(name="w")
    row = WorkerMessage.objects.create(
        worker=worker, message="hello", expiry=worker.created_at + timedelta(hours=1)
    )
    assert len(owner.pop("w").json()["messages"]) == 1  # read with the others, once
    requester.request_text()
    clock.shift(1)
    with django_assert_num_queries(2):
        assert owner.pop("w").json()["messages"][0]["message"] == "hello"
    moderator.post(f"/admin/workers/workermessage/{row.pk}/delete/", {"post": "yes"})
    assert owner.pop("w").json()["messages"] == []
