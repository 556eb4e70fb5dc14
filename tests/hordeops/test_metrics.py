"""`/metrics`: the horde's counters, every label set present, summed over every process."""

import time

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
