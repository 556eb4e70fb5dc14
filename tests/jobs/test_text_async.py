"""POST /api/v2/generate/text/async as the AI Horde answers it: every request is accepted, and
one that no worker can serve now carries the AI Horde's warning."""

import pytest

from jobs.models import TextRequest
from jobs.services.requests import NO_WORKER_WARNING


def test_a_request_for_a_model_no_worker_serves_is_queued_with_the_ai_hordes_warning(requester):
    created = requester.request_text(models=["koboldcpp/nobody-serves-this-13B"])
    assert created.status_code == 202
    answer = created.json()
    assert answer["message"] == NO_WORKER_WARNING
    assert answer["message"].startswith("Warning: No available workers can fulfill this request.")
    queued = TextRequest.objects.get(pk=answer["id"])
    assert (queued.state, queued.queued, queued.requested_models) == (
        TextRequest.State.ACTIVE,
        1,
        ["koboldcpp/nobody-serves-this-13B"],
    )


def test_a_request_queued_before_its_first_worker_starts_is_served_when_it_does(requester, owner):
    created = requester.request_text(models=["m-late"], params={"max_length": 64})
    assert created.status_code == 202 and "message" in created.json()
    popped = owner.pop("late-worker", models=["m-late"]).json()
    assert popped["id"] is not None
    assert popped["payload"]["prompt"] == "Once upon a time"
    assert owner.submit(popped["id"]).status_code == 200
    assert requester.status(created.json()["id"]).json()["done"] is True


def test_a_request_an_online_worker_may_take_carries_no_warning(requester, owner):
    owner.pop("worker-1")
    created = requester.request_text(models=["m1"])
    assert created.status_code == 202
    assert "message" not in created.json()


def test_a_request_only_an_offline_or_too_small_worker_serves_carries_the_warning(
    requester, owner, time_machine, settings
):
    time_machine.move_to("2026-12-01T12:00:00Z", tick=False)
    owner.pop("small-worker", models=["m1"], max_length=64)
    too_long = requester.request_text(models=["m1"], params={"max_length": 512, "max_context_length": 2048})
    assert too_long.json()["message"] == NO_WORKER_WARNING
    time_machine.shift(settings.WORKER_ONLINE_SECONDS + 1)
    offline = requester.request_text(models=["m1"], params={"max_length": 32})
    assert offline.json()["message"] == NO_WORKER_WARNING


# A request naming no model costs what a 13B model's does: max_length x 13 x 3.4 (the context
# multiplier of 2,048 tokens) / 100 per job, and the horde tax of 1.
@pytest.mark.parametrize(("max_length", "n", "kudos"), [(80, 1, 36), (85, 1, 39), (75, 3, 100), (16, 1, 8)])
def test_the_kudos_estimate_is_whole_as_the_ai_horde_rounds_it(requester, max_length, n, kudos):
    params = {"max_length": max_length, "n": n}
    created = requester.request_text(params=params)
    assert created.json()["kudos"] == kudos and isinstance(created.json()["kudos"], int)
    dry = requester.request_text(params=params, dry_run=True)
    assert dry.status_code == 200 and dry.json() == {"kudos": kudos}


def test_stop_sequences_and_the_prompt_reach_the_worker_exactly_as_sent(requester, owner):
    owner.pop("w", models=["m1"])
    stops = ["\nYou:", " ", "\t###\n", "END "]
    prompt = "  \n Someone: hi\nYou: "
    created = requester.request_text(prompt, models=["m1"], params={"stop_sequence": stops})
    assert created.status_code == 202
    payload = owner.pop("w", models=["m1"]).json()["payload"]
    assert payload["stop_sequence"] == stops
    assert payload["prompt"] == prompt
