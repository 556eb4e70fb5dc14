"""The text job lease, renewed by delivered output under a cap set at the pop."""

from datetime import datetime

import pytest
from django_redis import get_redis_connection

from hordeops import metrics
from jobs import leases
from jobs.models import Generation, TextRequest
from jobs.services import abort_stale_generations
from tests.conftest import progress

T0 = "2026-05-01 10:00:00+00:00"
POP = datetime.fromisoformat(T0).timestamp()


def _relayed(generation_id: str) -> list[str]:
    request_id = Generation.objects.get(pk=generation_id).request_id
    entries = get_redis_connection("default").xrange(leases.relay_key(request_id))
    return [fields[b"text"].decode() for _, fields in entries if fields[b"type"] == b"delta"]


def _renewals(outcome: str, trust: str) -> int:
    return metrics.value(metrics.LEASE_RENEWALS, outcome, trust)


def test_the_pop_starts_the_base_lease(chat_job, owner, clock):
    job = chat_job(owner)
    assert job["ttl"] == 150
    assert job["kind"] == "chat"
    assert job["lease"] == {
        "expires_at": "2026-05-01T10:02:30Z",
        "cap_seconds": 200,
        "preparation_seconds": 30,
    }
    assert job["payload"]["messages"] == [{"role": "user", "content": "Tell me a long story."}]
    assert job["payload"]["prompt"].endswith("<|im_start|>assistant\n")
    assert Generation.objects.get(pk=job["id"]).job_ttl == 150


def test_output_moves_the_lease_end_to_post_time_plus_the_base(chat_job, trusted_owner, clock):
    job = chat_job(trusted_owner)
    before = _renewals("granted", "trusted")
    clock.shift(100)
    answer = progress(trusted_owner, job["id"], 1, "Once upon a time")
    assert answer.status_code == 200
    assert answer.json() == {"lease": "granted", "expires_at": "2026-05-01T10:04:10Z", "ttl": 150}
    generation = Generation.objects.get(pk=job["id"])
    assert (generation.job_ttl, generation.renewals) == (250, 1)
    assert float(leases.state(job["id"])["lease_end"]) == POP + 250
    assert _renewals("granted", "trusted") == before + 1


def test_the_untrusted_cap_holds_the_lease_granted_once_then_at_cap(chat_job, owner, clock):
    job = chat_job(owner)
    granted, at_cap = _renewals("granted", "untrusted"), _renewals("at_cap", "untrusted")
    clock.shift(30)
    assert progress(owner, job["id"], 1).json()["lease"] == "granted"  # to 180 s
    assert Generation.objects.get(pk=job["id"]).job_ttl == 180
    clock.shift(30)
    held = progress(owner, job["id"], 2).json()
    assert held == {"lease": "granted", "expires_at": "2026-05-01T10:03:20Z", "ttl": 140}  # to the 200 s cap
    assert Generation.objects.get(pk=job["id"]).job_ttl == 200
    clock.shift(30)
    assert progress(owner, job["id"], 3).json() == {
        "lease": "at_cap",
        "expires_at": "2026-05-01T10:03:20Z",
        "ttl": 110,
    }
    assert Generation.objects.get(pk=job["id"]).job_ttl == 200
    assert _renewals("granted", "untrusted") == granted + 2
    assert _renewals("at_cap", "untrusted") == at_cap + 1


def test_the_trusted_cap_is_600_seconds_from_the_pop(chat_job, trusted_owner, clock):
    job = chat_job(trusted_owner)
    assert job["lease"]["cap_seconds"] == 600
    seq = 0
    for _ in range(5):  # posts at 100, 200, ... 500 s
        clock.shift(100)
        seq += 1
        answer = progress(trusted_owner, job["id"], seq).json()
    assert answer["lease"] == "granted"
    assert Generation.objects.get(pk=job["id"]).job_ttl == 600  # 500 + 150 held at 600
    clock.shift(50)
    seq += 1
    assert progress(trusted_owner, job["id"], seq).json()["lease"] == "at_cap"


def test_trust_at_the_pop_decides_the_cap(chat_job, owner, clock):
    job = chat_job(owner)
    owner.account.trusted = True
    owner.account.save()
    clock.shift(100)
    progress(owner, job["id"], 1)
    assert Generation.objects.get(pk=job["id"]).job_ttl == 200


def test_a_retry_is_accepted_but_neither_renews_nor_is_relayed_again(chat_job, trusted_owner, clock):
    job = chat_job(trusted_owner)
    clock.shift(10)
    progress(trusted_owner, job["id"], 1, "Hello")
    clock.shift(10)
    retry = progress(trusted_owner, job["id"], 1, "Hello")
    assert retry.status_code == 200
    assert retry.json()["lease"] == "not_renewed"
    assert retry.json()["expires_at"] == "2026-05-01T10:02:40Z"  # still 10 s + 150
    assert Generation.objects.get(pk=job["id"]).job_ttl == 160
    assert _relayed(job["id"]) == ["Hello"]


def test_an_empty_delta_does_not_renew(chat_job, trusted_owner, clock):
    job = chat_job(trusted_owner)
    clock.shift(20)
    answer = progress(trusted_owner, job["id"], 1, "")
    assert answer.json()["lease"] == "not_renewed"
    assert Generation.objects.get(pk=job["id"]).job_ttl == 150
    assert _relayed(job["id"]) == []
    # The empty post still used its seq: the next one is 2.
    assert progress(trusted_owner, job["id"], 2, "text").json()["lease"] == "granted"


def test_a_post_after_the_lease_end_is_relayed_but_does_not_revive_it(chat_job, trusted_owner, clock):
    job = chat_job(trusted_owner)
    clock.shift(151)
    answer = progress(trusted_owner, job["id"], 1, "late words")
    assert answer.status_code == 200
    assert answer.json() == {"lease": "lapsed", "expires_at": "2026-05-01T10:02:30Z", "ttl": 0}
    assert Generation.objects.get(pk=job["id"]).job_ttl == 150
    assert _relayed(job["id"]) == ["late words"]
    assert abort_stale_generations().aborted == 1


def test_progress_past_cap_is_relayed_but_not_renewed(chat_job, owner, clock):
    job = chat_job(owner)
    for seq in range(1, 4):  # renewed at 60, 120, 180 s: held at the 200 s cap
        clock.shift(60)
        progress(owner, job["id"], seq, f"part {seq} ")
    clock.shift(30)  # 210 s: past the cap
    answer = progress(owner, job["id"], 4, "part 4")
    assert answer.status_code == 200
    assert answer.json()["lease"] == "lapsed"
    assert _relayed(job["id"]) == ["part 1 ", "part 2 ", "part 3 ", "part 4"]
    assert Generation.objects.get(pk=job["id"]).job_ttl == 200


def test_a_gap_in_seq_is_ProgressOutOfOrder(chat_job, owner, clock):
    job = chat_job(owner)
    progress(owner, job["id"], 1)
    refused = progress(owner, job["id"], 3)
    assert (refused.status_code, refused.json()["rc"]) == (409, "ProgressOutOfOrder")
    assert "last accepted seq is 1" in refused.json()["message"]
    assert progress(owner, job["id"], 2).status_code == 200


def test_the_stale_pass_reads_the_renewed_job_ttl(chat_job, trusted_owner, clock):
    job = chat_job(trusted_owner)
    before = metrics.value(metrics.STALE_ABORTS, "trusted")
    clock.shift(140)
    progress(trusted_owner, job["id"], 1)  # lease now ends at 290 s
    clock.shift(20)  # 160 s: past the base lease, inside the renewed one
    assert abort_stale_generations().aborted == 0
    clock.shift(131)  # 291 s
    assert abort_stale_generations().aborted == 1
    assert Generation.objects.get(pk=job["id"]).state == Generation.State.ABORTED
    # The pass's counter is written after its transaction commits, which a test's
    # transaction never does; test_stale_pass_counter_counts_after_commit checks it.
    assert metrics.value(metrics.STALE_ABORTS, "trusted") == before


def test_a_renewal_between_whole_seconds_ends_the_lease_to_the_millisecond(chat_job, trusted_owner, clock):
    # The lease rule: aborted within lease + one pass of the last output. A job_ttl rounded up to
    # whole seconds held this job until 151 s.
    job = chat_job(trusted_owner)
    clock.shift(0.29)
    assert progress(trusted_owner, job["id"], 1).json()["lease"] == "granted"
    generation = Generation.objects.get(pk=job["id"])
    assert generation.job_ttl == 150.29
    assert float(leases.state(job["id"])["lease_end"]) == pytest.approx(POP + 150.29)
    assert "renewed to end 150.29 s after the pop" in generation.lease_description()
    clock.shift(149.99)  # 150.28 s
    assert abort_stale_generations().aborted == 0
    clock.shift(0.02)  # 150.30 s
    assert abort_stale_generations().aborted == 1


def test_the_stale_abort_counter_counts_after_commit(
    chat_job, owner, clock, django_capture_on_commit_callbacks
):
    job = chat_job(owner)
    before = metrics.value(metrics.STALE_ABORTS, "untrusted")
    clock.shift(151)
    with django_capture_on_commit_callbacks(execute=True):
        abort_stale_generations()
    assert metrics.value(metrics.STALE_ABORTS, "untrusted") == before + 1
    assert leases.state(job["id"])["dead"] == "1"


@pytest.mark.parametrize(
    ("end", "status", "rc"),
    [("abort", 400, "AbortedGen"), ("cancel", 409, "GenerationCancelled"), ("submit", 400, "DuplicateGen")],
)
def test_progress_after_the_generation_ended_is_refused(chat_job, owner, clock, end, status, rc):
    job = chat_job(owner)
    generation = Generation.objects.get(pk=job["id"])
    if end == "abort":
        clock.shift(151)
        abort_stale_generations()
    elif end == "cancel":
        owner.client.delete(f"/api/v2/generate/text/status/{generation.request_id}")
    else:
        owner.submit(job["id"], "the whole reply")
    refused = progress(owner, job["id"], 1)
    assert (refused.status_code, refused.json()["rc"]) == (status, rc)


def test_only_the_worker_that_popped_may_post(chat_job, owner, make_caller, clock):
    job = chat_job(owner)
    other = make_caller("other")
    refused = progress(other, job["id"], 1)
    assert (refused.status_code, refused.json()["rc"]) == (403, "WrongCredentials")


def test_a_text_job_keeps_its_flat_lease(requester, owner, clock):
    owner.pop("w")
    requester.request_text(models=["m1"])
    job = owner.pop("w").json()
    refused = progress(owner, job["id"], 1)
    assert (refused.status_code, refused.json()["rc"]) == (400, "BadRequest")
    assert Generation.objects.get(pk=job["id"]).job_ttl == 150


def test_a_chat_worker_that_never_posts_keeps_the_flat_lease(chat_job, trusted_owner, clock):
    job = chat_job(trusted_owner)
    clock.shift(151)
    assert abort_stale_generations().aborted == 1
    request = TextRequest.objects.get(pk=Generation.objects.get(pk=job["id"]).request_id)
    assert (request.state, request.queued) == ("active", 1)  # not committed: restarted


def test_progress_costs_a_pinned_number_of_queries(chat_job, trusted_owner, clock, django_assert_num_queries):
    job = chat_job(trusted_owner)
    clock.shift(10)
    # the key's account with the generation, its worker and request; the renewed job_ttl
    with django_assert_num_queries(2):
        assert progress(trusted_owner, job["id"], 1).json()["lease"] == "granted"
    with django_assert_num_queries(1):
        assert progress(trusted_owner, job["id"], 1).json()["lease"] == "not_renewed"


def test_the_post_that_commits_a_stream_costs_one_query_more(
    chat_job, trusted_owner, clock, django_assert_num_queries
):
    job = chat_job(trusted_owner)
    TextRequest.objects.filter(generations__pk=job["id"]).update(stream=True)
    clock.shift(10)
    # the key's account with the generation, its worker and request; the commitment; the job_ttl
    with django_assert_num_queries(3):
        assert progress(trusted_owner, job["id"], 1, "Once").json()["lease"] == "granted"
    with django_assert_num_queries(2):  # committed already
        assert progress(trusted_owner, job["id"], 2, " upon").json()["lease"] == "granted"
