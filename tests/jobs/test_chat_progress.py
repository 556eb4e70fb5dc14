"""The stream lease in Redis: its fields, its extension, and posts racing each other or the pass."""

import uuid
from collections import Counter
from datetime import UTC, timedelta

import pytest
from django.db.models import F
from django.utils import timezone
from django_redis import get_redis_connection

from hordeops import errors
from jobs import leases
from jobs.models import Generation, TextRequest
from jobs.services import abort_stale_generations, commit_stream, record_progress, submit_generation
from tests.conftest import progress, race

T0 = "2026-06-01 08:00:00+00:00"


def _events(generation: Generation) -> list[dict[str, str]]:
    entries = get_redis_connection("default").xrange(leases.relay_key(generation.request_id))
    return [{k.decode(): v.decode() for k, v in fields.items()} for _, fields in entries]


def _deltas(generation: Generation) -> list[str]:
    return [event["text"] for event in _events(generation) if event["type"] == "delta"]


def test_the_first_post_creates_the_stream_lease_with_its_fields(chat_job, owner, time_machine):
    time_machine.move_to(T0, tick=False)
    job = chat_job(owner)
    assert leases.state(job["id"]) == {}
    time_machine.shift(5)
    progress(owner, job["id"], 1, "abc", tokens=1)
    pop = timezone.datetime.fromisoformat(T0).timestamp()
    state = leases.state(job["id"])
    assert float(state["popped_at"]) == pop
    assert float(state["lease_end"]) == pop + 155
    assert float(state["cap_end"]) == pop + 200
    assert (state["last_seq"], state["output_len"], state["tokens"]) == ("1", "3", "1")
    ttl = get_redis_connection("default").ttl(leases.lease_key(job["id"]))
    assert 200 < ttl <= 200 + leases.KEY_GRACE_SECONDS


def test_each_post_extends_the_lease_and_the_output(chat_job, trusted_owner, time_machine):
    time_machine.move_to(T0, tick=False)
    job = chat_job(trusted_owner)
    pop = timezone.datetime.fromisoformat(T0).timestamp()
    for seq, delta in enumerate(["one ", "two ", "three"], start=1):
        time_machine.shift(40)
        progress(trusted_owner, job["id"], seq, delta, tokens=seq * 2)
        state = leases.state(job["id"])
        assert float(state["lease_end"]) == pop + 40 * seq + 150
        assert int(state["last_seq"]) == seq
    assert (state["output_len"], state["tokens"]) == ("13", "6")
    assert Generation.objects.get(pk=job["id"]).job_ttl == 270


@pytest.mark.django_db(transaction=True)
def test_two_posts_with_the_same_seq_at_once_relay_once_and_renew_once(make_caller, chat_job):
    owner = make_caller("owner", trusted=True)
    for round_ in range(10):
        job = chat_job(owner, f"w{round_}")
        generation = Generation.objects.get(pk=job["id"])

        def post(generation=generation):
            return record_progress(
                api_key=owner.api_key, generation_id=generation.pk, seq=1, delta="same words", tokens=2
            ).lease

        outcomes = race(post, post, return_exceptions=True)
        assert sorted(outcomes) == ["granted", "not_renewed"], outcomes
        assert _deltas(generation) == ["same words"]
        assert Generation.objects.get(pk=generation.pk).renewals == 1


@pytest.mark.django_db(transaction=True)
def test_a_renewal_racing_the_stale_pass_ends_renewed_and_alive_or_aborted_never_aborted_with_a_live_lease(
    make_caller, chat_job
):
    owner = make_caller("owner", trusted=True)
    outcomes = Counter()
    for round_ in range(20):
        job = chat_job(owner, f"w{round_}")
        # The base lease ends half a second from now in the database and in Redis.
        Generation.objects.filter(pk=job["id"]).update(popped_at=F("popped_at") - timedelta(seconds=149.5))
        now = timezone.now()

        def renew(job=job):
            return record_progress(api_key=owner.api_key, generation_id=job["id"], seq=1, delta="x", tokens=1)

        def stale_pass(now=now):
            # The pass runs one second later: the database lease has lapsed by then.
            return abort_stale_generations(now=now + timedelta(seconds=1))

        renewal, _ = race(renew, stale_pass, return_exceptions=True)
        generation = Generation.objects.get(pk=job["id"])
        lease = leases.state(job["id"])
        if generation.state == Generation.State.PROCESSING:
            assert renewal.lease == "granted"
            assert generation.job_ttl > 150
            assert "dead" not in lease
            outcomes["renewed"] += 1
        else:
            assert generation.state == Generation.State.ABORTED
            assert isinstance(renewal, errors.AbortedGen), renewal
            assert lease.get("dead") == "1"
            outcomes["aborted"] += 1
    assert sum(outcomes.values()) == 20
    print("renewal vs pass:", dict(outcomes))


def _stream_a_long_reply(owner, chat_job, time_machine, *, tokens: int, speed: int) -> tuple[str, object]:
    """Stream `tokens` at `speed` tokens/s, posting every 10 s, with the stale pass every 60 s.

    Returns the submit's outcome: its reward, or the error the worker got.
    """
    time_machine.move_to(T0, tick=False)
    job = chat_job(owner, max_length=tokens)
    generation_id = job["id"]
    elapsed, produced, seq = 0, 0, 0
    while produced < tokens:
        time_machine.shift(10)
        elapsed += 10
        chunk = min(speed * 10, tokens - produced)
        produced += chunk
        seq += 1
        answer = progress(owner, generation_id, seq, "x" * chunk * 4, tokens=produced)
        if answer.status_code != 200:
            return generation_id, answer.json()["rc"]
        if elapsed % 60 == 0:
            abort_stale_generations()
    answer = owner.submit(generation_id, "x" * tokens * 4)
    return generation_id, answer.json().get("rc", "accepted")


def test_a_16384_token_reply_at_30_tokens_a_second_finishes_for_a_trusted_worker(
    chat_job, trusted_owner, time_machine
):
    generation_id, outcome = _stream_a_long_reply(
        trusted_owner, chat_job, time_machine, tokens=16384, speed=30
    )
    assert outcome == "accepted"
    generation = Generation.objects.get(pk=generation_id)
    assert generation.state == Generation.State.DONE
    assert generation.tokens == 16384
    assert generation.job_ttl == 600
    assert TextRequest.objects.get(pk=generation.request_id).state == TextRequest.State.DONE


def test_the_same_reply_from_an_untrusted_worker_is_aborted_at_its_cap(chat_job, owner, time_machine):
    generation_id, outcome = _stream_a_long_reply(owner, chat_job, time_machine, tokens=16384, speed=30)
    assert outcome == "AbortedGen"
    generation = Generation.objects.get(pk=generation_id)
    assert generation.state == Generation.State.ABORTED
    assert generation.job_ttl == 200
    assert generation.finished_at - generation.popped_at <= timedelta(seconds=200 + 60)


def test_with_shrunken_settings_the_caps_scale_the_same_way(settings, chat_job, trusted_owner, time_machine):
    settings.TEXT_JOB_LEASE_SECONDS = 15
    settings.TEXT_JOB_PREPARATION_SECONDS = 3
    settings.TRUSTED_TEXT_JOB_LEASE_CAP_SECONDS = 60
    time_machine.move_to(T0, tick=False)
    job = chat_job(trusted_owner)
    assert job["ttl"] == 15
    for seq in range(1, 6):  # posts every 10 s keep a 15 s lease alive up to the 60 s cap
        time_machine.shift(10)
        assert progress(trusted_owner, job["id"], seq).json()["lease"] == "granted"
    time_machine.shift(10)
    assert progress(trusted_owner, job["id"], 6).json()["lease"] == "at_cap"
    time_machine.shift(1)
    assert abort_stale_generations().aborted == 1


@pytest.mark.django_db(transaction=True)
def test_a_submit_racing_a_progress_post_keeps_the_submitted_text(make_caller, chat_job):
    owner = make_caller("owner", trusted=True)
    job = chat_job(owner)

    def post():
        return record_progress(
            api_key=owner.api_key, generation_id=job["id"], seq=1, delta="partial", tokens=1
        )

    def submit():
        return submit_generation(
            api_key=owner.api_key, generation_id=job["id"], text="whole", state="ok", seed=0, gen_metadata=[]
        )

    race(post, submit, return_exceptions=True)
    generation = Generation.objects.get(pk=job["id"])
    assert (generation.state, generation.text) == (Generation.State.DONE, "whole")


@pytest.mark.parametrize("microseconds", [574507, 574567, 999999, 1])
def test_the_lease_held_at_the_cap_answers_at_cap_whatever_the_pop_time(chat_job, owner, microseconds):
    """The cap is stored as its own string: a float printed with 14 digits fell short of it."""
    popped = timezone.datetime(2026, 6, 1, 8, 0, 0, microseconds, tzinfo=UTC)
    job = chat_job(owner)
    Generation.objects.filter(pk=job["id"]).update(
        popped_at=popped, job_ttl=150, cap_seconds=200, trusted_at_pop=False
    )
    generation = Generation.objects.select_related("request").get(pk=job["id"])

    def post(seq: int, at: float):
        return leases.renew(
            generation, seq=seq, delta="words", tokens=None, now=popped + timedelta(seconds=at)
        )

    assert post(1, 30).outcome == "granted"  # to 180 s
    held = post(2, 60)  # 210 s would pass the cap: held at 200 s, granted this once
    assert held.outcome == "granted"
    assert held.lease_end == pytest.approx(popped.timestamp() + 200, abs=1e-6)
    assert post(3, 90).outcome == "at_cap"
    assert post(4, 120).outcome == "at_cap"


@pytest.mark.django_db(transaction=True)
def test_a_stream_committing_while_the_pass_aborts_either_commits_and_faults_or_restarts(
    make_caller, chat_job
):
    owner = make_caller("owner", trusted=True)
    outcomes = Counter()
    for round_ in range(15):
        job = chat_job(owner, f"w{round_}")
        generation = Generation.objects.get(pk=job["id"])
        Generation.objects.filter(pk=generation.pk).update(popped_at=F("popped_at") - timedelta(seconds=151))

        def commit(generation=generation):
            return commit_stream(request_id=generation.request_id, generation_id=generation.pk)

        committed, _ = race(commit, abort_stale_generations, return_exceptions=True)
        request = TextRequest.objects.get(pk=generation.request_id)
        assert Generation.objects.get(pk=generation.pk).state == Generation.State.ABORTED
        if committed == "chat-model":  # the committed generation's model
            # Committed first: the abort then ends the request, with no fallback.
            assert (request.stream_generation, request.state, request.queued) == (generation.pk, "faulted", 0)
            outcomes["committed, then faulted"] += 1
        else:
            # Aborted first: nothing committed, and the job waits for another worker.
            assert committed is None
            assert (request.stream_generation, request.state, request.queued) == (None, "active", 1)
            outcomes["restarted"] += 1
    assert sum(outcomes.values()) == 15
    print("commit vs pass:", dict(outcomes))


def _streaming(job: dict) -> Generation:
    """The job's generation, its requester made one that reads the reply as a stream."""
    generation = Generation.objects.get(pk=job["id"])
    TextRequest.objects.filter(pk=generation.request_id).update(stream=True)
    return generation


def test_a_streaming_requesters_first_useful_post_commits_its_stream_and_its_delta_says_so(chat_job, owner):
    generation = _streaming(chat_job(owner))
    assert progress(owner, generation.pk, 1, "  \n").status_code == 200  # white space alone: held
    assert not Generation.objects.get(pk=generation.pk).streamed
    assert progress(owner, generation.pk, 2, "Once").status_code == 200
    assert progress(owner, generation.pk, 3, " upon").status_code == 200
    request = TextRequest.objects.get(pk=generation.request_id)
    assert Generation.objects.get(pk=generation.pk).streamed
    assert request.stream_generation == generation.pk
    # Only the delta of the post that committed carries the model: the follower commits nothing.
    assert [(e["text"], e.get("model")) for e in _events(generation)] == [
        ("  \n", None),
        ("Once", "chat-model"),
        (" upon", None),
    ]


def test_a_post_to_a_requester_that_does_not_stream_commits_nothing(chat_job, owner):
    generation = Generation.objects.get(pk=chat_job(owner)["id"])
    assert progress(owner, generation.pk, 1, "Once").status_code == 200
    assert not Generation.objects.get(pk=generation.pk).streamed
    assert TextRequest.objects.get(pk=generation.request_id).stream_generation is None
    assert [e.get("model") for e in _events(generation)] == [None]


@pytest.mark.django_db(transaction=True)
def test_a_committing_post_racing_the_stale_pass_either_commits_and_faults_or_restarts_uncommitted(
    make_caller, chat_job
):
    owner = make_caller("owner", trusted=True)
    outcomes = Counter()
    for round_ in range(15):
        generation = _streaming(chat_job(owner, f"w{round_}"))
        Generation.objects.filter(pk=generation.pk).update(popped_at=F("popped_at") - timedelta(seconds=151))

        def post(generation=generation):
            return record_progress(
                api_key=owner.api_key, generation_id=generation.pk, seq=1, delta="Once", tokens=1
            )

        posted, _ = race(post, abort_stale_generations, return_exceptions=True)
        request = TextRequest.objects.get(pk=generation.request_id)
        assert Generation.objects.get(pk=generation.pk).state == Generation.State.ABORTED
        if request.stream_generation is not None:
            # Committed first: its delta went out saying so, and the abort ends the request.
            assert (request.state, request.queued) == ("faulted", 0)
            assert [e.get("model") for e in _events(generation) if e["type"] == "delta"] == ["chat-model"]
            outcomes["committed, then faulted"] += 1
        else:
            # Aborted first: nothing committed, and the job waits for another worker.
            assert (request.state, request.queued) == ("active", 1)
            if isinstance(posted, errors.AbortedGen):
                # The pass had killed the lease too: nothing relayed.
                assert _deltas(generation) == []
                outcomes["restarted, post refused"] += 1
            else:
                # The post read the job running, the pass's abort came before its commitment and
                # its lease was killed after: relayed as any lapsed post is, but committing nothing,
                # so the follower skips it.
                assert posted.lease == "lapsed", posted
                assert [e.get("model") for e in _events(generation) if e["type"] == "delta"] == [None]
                outcomes["restarted, post relayed as lapsed"] += 1
    assert sum(outcomes.values()) == 15
    print("committing post vs pass:", dict(outcomes))


def test_a_lease_killed_before_any_post_refuses_the_first_post(chat_job, owner):
    job = chat_job(owner)
    leases.kill([job["id"]])  # as the stale pass does after aborting it
    Generation.objects.filter(pk=job["id"]).update(state=Generation.State.ABORTED, finished_at=timezone.now())
    refused = progress(owner, job["id"], 1)
    assert (refused.status_code, refused.json()["rc"]) == (400, "AbortedGen")


def test_the_script_answers_dead_for_a_lease_killed_before_it_existed(db):
    generation = Generation(
        id=uuid.uuid4(),
        request=TextRequest(id=uuid.uuid4(), max_length=80),
        popped_at=timezone.now(),
        job_ttl=150,
        cap_seconds=200,
        trusted_at_pop=False,
    )
    leases.kill([generation.pk])
    renewal = leases.renew(generation, seq=1, delta="x", tokens=None, now=timezone.now())
    assert (renewal.outcome, renewal.last_seq) == ("dead", 0)


def _lose_the_lease(generation: Generation) -> None:
    """What a Redis restart does to a generation: its lease and relay stream are gone, and so is
    the mark of since when Redis has held leases."""
    get_redis_connection("default").delete(
        leases.lease_key(generation.pk), leases.relay_key(generation.request_id), leases.SINCE_KEY
    )


def test_a_lease_redis_lost_is_rebuilt_from_the_row_while_its_requester_follows(
    chat_job, owner, time_machine
):
    time_machine.move_to(T0, tick=False)
    job = chat_job(owner)
    generation = Generation.objects.get(pk=job["id"])
    for seq in (1, 2):
        assert progress(owner, job["id"], seq, f"part {seq} ").status_code == 200
    _lose_the_lease(generation)
    follower = get_redis_connection("default").pubsub()
    follower.subscribe(leases.relay_key(generation.request_id))  # the requester's hub
    try:
        assert follower.get_message(timeout=2)["type"] == "subscribe"
        time_machine.shift(10)
        rebuilt = progress(owner, job["id"], 3, "part 3 ")
        assert rebuilt.status_code == 200, rebuilt.json()
        assert rebuilt.json()["lease"] == "granted"
        assert progress(owner, job["id"], 4, "part 4").status_code == 200
        assert follower.get_message(timeout=2)["type"] == "message"  # relayed live
    finally:
        follower.close()
    assert _deltas(generation) == ["part 3 ", "part 4"]
    state = leases.state(job["id"])
    assert (state["last_seq"], float(state["cap_end"])) == ("4", generation.popped_at.timestamp() + 200)


def test_a_lease_redis_lost_with_nobody_following_cancels_the_job(chat_job, owner, time_machine):
    time_machine.move_to(T0, tick=False)
    job = chat_job(owner)
    generation = Generation.objects.get(pk=job["id"])
    assert progress(owner, job["id"], 1).status_code == 200
    _lose_the_lease(generation)
    time_machine.shift(10)
    refused = progress(owner, job["id"], 2)
    assert (refused.status_code, refused.json()["rc"]) == (409, "GenerationCancelled")
    assert "Redis restarted" in refused.json()["message"]
    generation.refresh_from_db()
    assert generation.state == Generation.State.CANCELLED
    assert generation.request.state == TextRequest.State.CANCELLED
    assert generation.settlement_information["reason"] == errors.ServiceUnavailable.code
    again = owner.submit(job["id"], "The end.")
    assert (again.status_code, again.json()["rc"]) == (409, "GenerationCancelled")


def test_a_first_post_past_seq_1_in_a_redis_up_since_before_the_pop_is_still_a_gap(
    chat_job, owner, time_machine
):
    time_machine.move_to(T0, tick=False)
    get_redis_connection("default").set(leases.SINCE_KEY, timezone.datetime.fromisoformat(T0).timestamp() - 1)
    job = chat_job(owner)
    refused = progress(owner, job["id"], 2)
    assert (refused.status_code, refused.json()["rc"]) == (409, "ProgressOutOfOrder")
    assert progress(owner, job["id"], 1).status_code == 200
