"""A generation's output is bounded by what its job asked for (TextRequest.output_limit_bytes)."""

from django_redis import get_redis_connection

from jobs import leases, relay
from jobs.models import Generation, TextRequest
from tests.conftest import progress


def _limit(max_length: int) -> int:
    return max_length * TextRequest.OUTPUT_BYTES_PER_TOKEN + TextRequest.OUTPUT_ALLOWANCE_BYTES


def _relayed(job: dict) -> str:
    generation = Generation.objects.get(pk=job["id"])
    entries = get_redis_connection("default").xrange(relay.relay_key(generation.request_id))
    return "".join(fields[b"text"].decode() for _, fields in entries if fields[b"type"] == b"delta")


def test_the_limit_is_16_bytes_a_requested_token_plus_1_kib(requester):
    text_request = TextRequest(max_length=20)
    assert text_request.output_limit_bytes == 20 * 16 + 1024 == _limit(20)


def test_a_progress_post_past_the_bound_is_refused_and_neither_relayed_nor_renewing(chat_job, owner):
    job = chat_job(owner, max_length=20)
    limit = _limit(20)
    assert progress(owner, job["id"], 1, "a" * (limit - 10)).json()["lease"] == "granted"
    renewals = Generation.objects.get(pk=job["id"]).renewals

    refused = progress(owner, job["id"], 2, "b" * 11)
    assert refused.status_code == 400
    assert refused.json()["rc"] == "OutputTooLong"
    assert refused.json()["limit_bytes"] == limit
    assert "20 tokens" in refused.json()["message"]
    assert _relayed(job) == "a" * (limit - 10)
    assert Generation.objects.get(pk=job["id"]).renewals == renewals
    assert leases.state(job["id"])["last_seq"] == "1"  # the refused post took no seq

    # The same seq with what still fits is taken: the bound is exact, in bytes.
    assert progress(owner, job["id"], 2, "c" * 10).json()["lease"] == "granted"
    assert len(_relayed(job).encode()) == limit


def test_the_bound_counts_utf8_bytes_not_characters(chat_job, owner):
    job = chat_job(owner, max_length=20)
    limit = _limit(20)
    snowmen = "☃" * (limit // 3)  # 3 bytes each
    assert progress(owner, job["id"], 1, snowmen).status_code == 200
    assert progress(owner, job["id"], 2, "☃").json()["rc"] == "OutputTooLong"


def test_a_flood_of_huge_posts_on_a_short_job_relays_no_more_than_its_bound(chat_job, owner):
    client = get_redis_connection("default")
    job = chat_job(owner, max_length=20)
    key = relay.relay_key(Generation.objects.get(pk=job["id"]).request_id)
    codes = [progress(owner, job["id"], 1, "x" * 100_000).json().get("rc") for _ in range(20)]
    assert codes == ["OutputTooLong"] * 20
    assert not client.exists(key) or client.memory_usage(key) < 4096


def test_a_submit_past_the_bound_is_refused_and_the_job_stays_the_workers(chat_job, owner):
    job = chat_job(owner, max_length=20)
    refused = owner.submit(job["id"], "z" * (_limit(20) + 1))
    assert refused.status_code == 400 and refused.json()["rc"] == "OutputTooLong"
    assert Generation.objects.get(pk=job["id"]).state == Generation.State.PROCESSING
    accepted = owner.submit(job["id"], "z" * _limit(20))
    assert accepted.status_code == 200, accepted.content
    assert Generation.objects.get(pk=job["id"]).state == Generation.State.DONE


def test_a_text_jobs_submit_is_bounded_by_its_max_length_too(requester, owner):
    owner.pop("text-worker", max_length=512)
    requester.request_text("Once", params={"max_length": 16}, models=["m1"])
    job = owner.pop("text-worker", max_length=512).json()
    assert owner.submit(job["id"], "q" * (_limit(16) + 1)).json()["rc"] == "OutputTooLong"
    assert owner.submit(job["id"], "q" * _limit(16)).status_code == 200


def test_a_finished_requests_relay_stream_expires_within_a_minute(
    chat_job, owner, django_capture_on_commit_callbacks
):
    client = get_redis_connection("default")
    job = chat_job(owner, max_length=20)
    key = relay.relay_key(Generation.objects.get(pk=job["id"]).request_id)
    progress(owner, job["id"], 1, "words ")
    assert client.ttl(key) > 60  # kept while the request runs
    with django_capture_on_commit_callbacks(execute=True):
        assert owner.submit(job["id"], "words and more").status_code == 200
    assert 0 < client.ttl(key) <= 60
    assert client.ttl(leases.lease_key(job["id"])) <= leases.KEY_GRACE_SECONDS


def test_a_cancelled_requests_relay_stream_expires_within_a_minute(
    chat_job, owner, django_capture_on_commit_callbacks
):
    from jobs.services import cancel_request

    client = get_redis_connection("default")
    job = chat_job(owner, max_length=20)
    request_id = Generation.objects.get(pk=job["id"]).request_id
    progress(owner, job["id"], 1, "words ")
    with django_capture_on_commit_callbacks(execute=True):
        cancel_request(request_id=request_id)
    assert 0 < client.ttl(relay.relay_key(request_id)) <= 60


def test_a_lease_rebuilt_after_redis_lost_it_keeps_the_output_already_relayed(chat_job, owner, time_machine):
    time_machine.move_to("2026-06-01 08:00:00+00:00", tick=False)
    job = chat_job(owner, max_length=20)
    limit = _limit(20)
    generation = Generation.objects.get(pk=job["id"])
    assert progress(owner, job["id"], 1, "a" * (limit - 10)).json()["lease"] == "granted"
    assert Generation.objects.get(pk=job["id"]).relayed_bytes == limit - 10
    # A Redis restart: the lease, the relay stream and the mark of since when are gone.
    redis = get_redis_connection("default")
    redis.delete(leases.lease_key(generation.pk), relay.relay_key(generation.request_id), leases.SINCE_KEY)
    follower = redis.pubsub()
    follower.subscribe(relay.relay_key(generation.request_id))  # the requester still follows
    try:
        assert follower.get_message(timeout=2)["type"] == "subscribe"
        time_machine.shift(10)
        refused = progress(owner, job["id"], 2, "b" * 11)
        assert (refused.status_code, refused.json()["rc"]) == (400, "OutputTooLong")
        assert progress(owner, job["id"], 2, "c" * 10).json()["lease"] == "granted"
    finally:
        follower.close()
    assert leases.state(job["id"])["output_len"] == str(limit)


def test_output_relayed_past_the_lease_end_is_copied_to_the_row_too(chat_job, owner, time_machine):
    time_machine.move_to("2026-06-01 08:00:00+00:00", tick=False)
    job = chat_job(owner, max_length=20)
    assert progress(owner, job["id"], 1, "abc").json()["lease"] == "granted"
    time_machine.shift(1000)  # past the lease and its cap: relayed, not renewed
    assert progress(owner, job["id"], 2, "defg").json()["lease"] == "lapsed"
    assert Generation.objects.get(pk=job["id"]).relayed_bytes == 7
