"""`/metrics`: the horde's counters, every label set present, summed over every process."""

import os
import time

import pytest
import redis
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families
from rest_framework.test import APIClient

from hordeops import metrics


def scrape() -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    answer = APIClient().get("/metrics")
    assert answer.status_code == 200
    samples = {}
    for family in text_string_to_metric_families(answer.content.decode()):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def test_every_horde_counter_is_exported_with_every_label_set_from_the_start(db):
    samples = scrape()
    for outcome in ("granted", "at_cap"):
        for trust in ("trusted", "untrusted"):
            key = ("horde_text_lease_renewals_total", (("outcome", outcome), ("trust", trust)))
            assert key in samples
    for trust in ("trusted", "untrusted"):
        assert ("horde_text_stale_aborts_total", (("trust", trust),)) in samples
    assert ("horde_pop_lease_capacity_limited_total", ()) in samples


def test_a_count_made_anywhere_shows_on_the_scrape(db):
    key = ("horde_text_stale_aborts_total", (("trust", "trusted"),))
    before = scrape()[key]
    metrics.increment(metrics.STALE_ABORTS, "trusted", amount=3, now=timezone.now())
    assert scrape()[key] == before + 3


def test_totals_that_redis_lost_say_since_when_they_count(db):
    key = ("horde_text_stale_aborts_created", (("trust", "trusted"),))
    metrics._redis().delete(metrics.METRICS_KEY)  # what a Redis restart does to the totals
    first = scrape()[key]
    assert abs(first - time.time()) < 60  # a Unix time, now, not zero
    metrics.increment(metrics.STALE_ABORTS, "trusted", amount=2, now=timezone.now())
    assert scrape()[key] == first  # counting on: the same start

    metrics._redis().delete(metrics.METRICS_KEY)  # and again
    time.sleep(0.01)
    samples = scrape()
    assert samples[key] > first  # the scrape says the totals started again
    assert samples[("horde_text_stale_aborts_total", (("trust", "trusted"),))] == 0


def test_the_capacity_limited_gauge_counts_such_workers_online_now_not_their_polls(db, owner, time_machine):
    time_machine.move_to(timezone.now(), tick=False)
    declared = {"chat": True, "max_length": 16384, "max_context_length": 32768}  # unmeasured: 1,200
    counter = ("horde_pop_lease_capacity_limited_total", ())
    gauge = ("horde_workers_capacity_limited_online", ())
    before = scrape()[counter]
    for _ in range(5):
        owner.pop("slow-chat", **declared)
    owner.pop("fits", chat=True, max_length=1200)  # capacity 1,200 covers it
    owner.pop("text-only", max_length=16384)  # no chat: no capacity to fall short of
    samples = scrape()
    assert (samples[counter] - before, samples[gauge]) == (5, 1)
    time_machine.shift(301)  # past WORKER_ONLINE_SECONDS: no longer online
    assert scrape()[gauge] == 0


def _stored(field: str, client=None) -> int:
    return int((client or metrics._redis()).hget(metrics.METRICS_KEY, field) or 0)


def test_a_count_made_soon_shows_on_the_next_scrape_of_its_process(db):
    key = ("horde_pop_lease_capacity_limited_total", ())
    before = scrape()[key]
    metrics.increment_soon(metrics.POP_LEASE_CAPACITY_LIMITED, amount=2, now=timezone.now())
    assert scrape()[key] == before + 2


def test_a_count_made_soon_reaches_redis_within_the_flush_interval_without_a_read(settings):
    settings.METRICS_FLUSH_SECONDS = 0.05
    field = "test_soon|written"  # a field of this test's own: no other count lands in it
    before = _stored(field)
    counts = metrics.PendingCounts()
    counts.add(field, metrics.minute_key(timezone.now()), 2)
    counts.add(field, metrics.minute_key(timezone.now()), 1)
    deadline = time.monotonic() + 5
    while _stored(field) != before + 3:
        assert time.monotonic() < deadline, "the writing thread did not write the pending counts"
        time.sleep(0.02)


def test_with_no_flush_interval_a_count_made_soon_is_written_at_once(db, settings):
    settings.METRICS_FLUSH_SECONDS = 0
    field = metrics.POP_LEASE_CAPACITY_LIMITED.field()
    metrics.pending.flush()
    before = _stored(field)
    metrics.increment_soon(metrics.POP_LEASE_CAPACITY_LIMITED, now=timezone.now())
    assert _stored(field) == before + 1


def test_counts_that_redis_could_not_take_are_kept_for_the_next_write(private_redis):
    client = redis.Redis.from_url(private_redis.url, socket_timeout=2)
    counts = metrics.PendingCounts(client=lambda: client)
    bucket = metrics.minute_key(timezone.now())
    private_redis.kill()
    counts.add("test_soon|kept", bucket, 3)
    with pytest.raises(redis.ConnectionError):
        counts.flush()
    counts.add("test_soon|kept", bucket, 1)
    private_redis.start()  # empty, as after a crash: what it holds is what was written since
    counts.flush()
    counts.flush()  # nothing is written twice
    assert _stored("test_soon|kept", client) == 4
    assert int(client.hget(bucket, "test_soon|kept")) == 4
    assert 0 < client.ttl(bucket) <= metrics.MINUTE_KEY_TTL_SECONDS


def test_a_forked_child_leaves_its_parents_pending_counts_to_the_parent(settings):
    settings.METRICS_FLUSH_SECONDS = 60  # its thread writes nothing while the test runs
    field = "test_soon|forked"
    before = _stored(field)
    counts = metrics.PendingCounts()
    counts.add(field, metrics.minute_key(timezone.now()), 5)
    child = os.fork()
    if child == 0:  # the child: nothing pending, so nothing of the parent's is written twice
        counts.flush()
        os._exit(0)
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert _stored(field) == before
    counts.flush()
    assert _stored(field) == before + 5


def test_give_backs_and_429s_are_counted_by_trust_and_by_reason(
    db, owner, requester, settings, django_capture_on_commit_callbacks
):
    before = scrape()
    requester.request_text()
    job = owner.pop("giver").json()
    with django_capture_on_commit_callbacks(execute=True):  # counted once the give-back commits
        assert owner.submit(job["id"], "", state="faulted").status_code == 200

    # The account's bound of waiting requests, and a requester route's token bucket.
    settings.ACCOUNT_MAX_WAITING_REQUESTS = 2  # the given-back request waits again: one more
    assert requester.request_text().status_code == 202
    assert requester.request_text().json()["rc"] == "TooManyPrompts"
    settings.KEY_RATE_PER_SECOND, settings.KEY_RATE_BURST = 1, 1
    requester.client.get("/api/v2/status/models", HTTP_APIKEY=requester.api_key)
    limited = requester.client.get("/api/v2/status/models", HTTP_APIKEY=requester.api_key)
    assert limited.status_code == 429
    chat = requester.client.post(
        "/v1/chat/completions",
        {"model": "m", "messages": [{"role": "user", "content": "hi"}]},
        format="json",
        HTTP_AUTHORIZATION=f"Bearer {requester.api_key}",
    )
    assert chat.status_code == 429

    after = scrape()

    def added(name, **labels):
        key = (name, tuple(sorted(labels.items())))
        return after[key] - before.get(key, 0)

    assert added("horde_text_give_backs_total", trust="untrusted") == 1
    assert added("horde_text_give_backs_total", trust="trusted") == 0
    assert added("horde_refusals_429_total", reason="waiting_requests") == 1
    assert added("horde_refusals_429_total", reason="rate_limit") == 2
    assert added("horde_refusals_429_total", reason="bad_keys") == 0


def test_the_queue_gauge_says_how_long_the_oldest_request_of_each_model_has_waited(
    db, owner, requester, time_machine
):
    time_machine.move_to("2026-05-01 12:00:00+00:00", tick=False)
    owner.pop("serving", models=["served-model"])
    requester.request_text(models=["served-model"])
    requester.request_text(models=["nobody-serves-this"])
    time_machine.shift(30)
    requester.request_text()  # any model
    requester.request_text(models=["served-model"])
    time_machine.shift(10)
    samples = scrape()
    oldest = {
        dict(labels)["model"]: value
        for (name, labels), value in samples.items()
        if name == "horde_text_queue_oldest_seconds"
    }
    assert oldest == {"served-model": 40, "unserved": 40, "any": 10}
