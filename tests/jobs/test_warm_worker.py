"""The next turn of a conversation goes to the worker that served the last one
(`jobs.affinity`, the offer rule's `eligibility.preferred_sql`): in its window, if it is free;
anyone after it, or at once when it is busy or gone; never steered by another account."""

from datetime import UTC, datetime, timedelta

import pytest
from django_redis import get_redis_connection

from jobs import affinity
from jobs.models import TextRequest
from jobs.services.requests import render_chat_prompt
from workers.models import Worker

pytestmark = pytest.mark.django_db

STORY = "Once upon a time, in a kingdom by the sea,"
REPLY = " there lived a king who loved riddles."


@pytest.fixture(autouse=True)
def _window(settings):
    settings.WARM_WORKER_SECONDS = 2
    settings.WARM_WORKER_MEMORY_SECONDS = 600


def _job(answer) -> str | None:
    assert answer.status_code == 200, answer.content
    return answer.json()["id"]


def _first_turn(requester, owner, django_capture_on_commit_callbacks, *, served_by: str = "warm") -> None:
    """Both workers online; `served_by` serves the first turn of the story."""
    other = "cold" if served_by == "warm" else "warm"
    assert _job(owner.pop(other)) is None
    assert requester.request_text(STORY).status_code == 202
    job = _job(owner.pop(served_by))
    with django_capture_on_commit_callbacks(execute=True):
        assert owner.submit(job, REPLY).status_code == 200


def test_a_follow_up_goes_to_the_worker_that_served_the_last_turn(
    requester, owner, django_capture_on_commit_callbacks
):
    _first_turn(requester, owner, django_capture_on_commit_callbacks)
    requester.request_text(STORY + REPLY + " One day, a stranger came.")
    assert _job(owner.pop("cold")) is None
    job = _job(owner.pop("warm"))
    assert job is not None
    request = TextRequest.objects.get(generations__id=job)
    assert request.preferred_worker == Worker.objects.get(name="warm").pk


def test_a_story_in_any_script_is_known_by_the_same_digest_in_python_and_postgresql(
    requester, owner, django_capture_on_commit_callbacks
):
    story, reply = "Il était une fois un dragon 🐉,", " qui aimait les énigmes — «toujours»."
    assert _job(owner.pop("cold")) is None
    requester.request_text(story)
    job = _job(owner.pop("warm"))
    with django_capture_on_commit_callbacks(execute=True):
        owner.submit(job, reply)
    requester.request_text(story + reply + " Fin.")
    assert _job(owner.pop("cold")) is None
    assert _job(owner.pop("warm")) is not None


def test_anyone_gets_the_follow_up_once_the_window_is_over(
    requester, owner, django_capture_on_commit_callbacks, time_machine
):
    time_machine.move_to(datetime.now(UTC), tick=False)
    _first_turn(requester, owner, django_capture_on_commit_callbacks)
    requester.request_text(STORY + REPLY + " One day, a stranger came.")
    assert _job(owner.pop("cold")) is None
    time_machine.shift(timedelta(seconds=2.1))
    assert _job(owner.pop("cold")) is not None


def test_a_busy_warm_worker_does_not_hold_the_follow_up(requester, owner, django_capture_on_commit_callbacks):
    _first_turn(requester, owner, django_capture_on_commit_callbacks)
    requester.request_text("Another story altogether.")
    assert _job(owner.pop("warm")) is not None  # its one thread busy
    requester.request_text(STORY + REPLY + " One day, a stranger came.")
    assert TextRequest.objects.latest("created_at").preferred_worker is None
    assert _job(owner.pop("cold")) is not None


def test_a_warm_worker_gone_offline_does_not_hold_the_follow_up(
    requester, owner, django_capture_on_commit_callbacks, settings
):
    _first_turn(requester, owner, django_capture_on_commit_callbacks)
    Worker.objects.filter(name="warm").update(left_at=Worker.objects.get(name="warm").last_pop_at)
    requester.request_text(STORY + REPLY + " One day, a stranger came.")
    assert _job(owner.pop("cold")) is not None


def test_a_prompt_that_continues_no_conversation_goes_to_anyone(
    requester, owner, django_capture_on_commit_callbacks
):
    _first_turn(requester, owner, django_capture_on_commit_callbacks)
    # The story, but not the reply the warm worker gave: not a continuation of that turn.
    requester.request_text(STORY + " there lived a queen.")
    assert _job(owner.pop("cold")) is not None


def test_another_account_cannot_steer_its_requests_to_a_warm_worker(
    requester, owner, make_caller, django_capture_on_commit_callbacks
):
    _first_turn(requester, owner, django_capture_on_commit_callbacks)
    make_caller("stranger").request_text(STORY + REPLY + " One day, a stranger came.")
    assert TextRequest.objects.latest("created_at").preferred_worker is None
    assert _job(owner.pop("cold")) is not None


def test_a_window_of_zero_turns_the_preference_off(
    requester, owner, django_capture_on_commit_callbacks, settings
):
    _first_turn(requester, owner, django_capture_on_commit_callbacks)
    settings.WARM_WORKER_SECONDS = 0
    requester.request_text(STORY + REPLY + " One day, a stranger came.")
    assert _job(owner.pop("cold")) is not None


def test_nothing_of_the_text_is_kept(requester, owner, django_capture_on_commit_callbacks):
    _first_turn(requester, owner, django_capture_on_commit_callbacks)
    kept = get_redis_connection("default").lrange(f"hordeops:warm:{requester.account.pk}", 0, -1)
    assert len(kept) == 1
    assert b"kingdom" not in kept[0] and b"riddles" not in kept[0]


def test_a_chats_next_messages_begin_with_what_its_last_turn_is_remembered_by():
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi!"}]
    first = TextRequest(kind=TextRequest.Kind.CHAT, prompt=render_chat_prompt(messages))
    reply = "Hello there."
    follow_up = render_chat_prompt(
        [*messages, {"role": "assistant", "content": reply}, {"role": "user", "content": "How are you?"}]
    )
    assert follow_up.startswith(affinity.continued(first, reply))
    assert len(follow_up) > len(affinity.continued(first, reply))
