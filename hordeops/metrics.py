"""The horde's counters, kept in Redis so that every process adds to the same total.

The stale pass runs in a Celery worker and progress posts in any of several web processes,
yet `/metrics` on any web process must show them all: so the counters live in one Redis
hash, incremented by whoever counts (the lease Lua script increments renewals itself), and
a collector reads the hash at scrape time. Every label set is exported from the start.

Redis keeps nothing on disk here, so a Redis restart starts the totals again from zero. It
is not silent: the hash records when it was first counted into (`created`, set at the first
scrape that finds it missing), exported as each counter's `_created` sample, which Prometheus
reads as a counter reset and the operations page shows as "counting since".

Each count also lands in a per-minute hash that lives two hours, so that the operations page
can show the last hour minute by minute without a time-series database.

A count made on every pop (`increment_soon`) is written within METRICS_FLUSH_SECONDS rather
than at once: its own Redis round trip was a tenth of an idle worker's pop. A read in the same
process (`value`, `per_minute`, a scrape) writes what is pending first.
"""

import atexit
import logging
import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.conf import settings
from prometheus_client.core import REGISTRY, CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from hordeops import clock

METRICS_KEY = "hordeops:metrics"
# The field of METRICS_KEY that says since when its totals count (Unix seconds).
CREATED_FIELD = "created"
MINUTE_KEY_PREFIX = "hordeops:metrics:minute:"
# A minute's hash outlives the hour the operations page shows, with room for clock skew.
MINUTE_KEY_TTL_SECONDS = 2 * 3600
TRUST_LABELS = ("trusted", "untrusted")


@dataclass(frozen=True)
class HordeCounter:
    name: str
    documentation: str
    labels: tuple[str, ...]
    label_sets: tuple[tuple[str, ...], ...]

    def field(self, *values: str) -> str:
        """The Redis hash field of one label set, as the Lua script writes it too."""
        return "|".join((self.name, *values))


LEASE_RENEWALS = HordeCounter(
    "horde_text_lease_renewals",
    "Progress posts that moved a text job's lease end (granted) or were held at its cap (at_cap).",
    ("outcome", "trust"),
    tuple((o, t) for o in ("granted", "at_cap") for t in TRUST_LABELS),
)
STALE_ABORTS = HordeCounter(
    "horde_text_stale_aborts",
    "Text generations aborted by the stale pass because their lease lapsed.",
    ("trust",),
    tuple((t,) for t in TRUST_LABELS),
)
POP_LEASE_CAPACITY_LIMITED = HordeCounter(
    "horde_pop_lease_capacity_limited",
    "Pops by a chat worker whose capacity is below the max_length it declares.",
    (),
    ((),),
)
TIMED_OUT_REFUSALS = HordeCounter(
    "horde_timed_out_refusals",
    "Calls refused because their client address is in a moderator's timeout (403 TimeoutIP).",
    (),
    ((),),
)
GIVE_BACKS = HordeCounter(
    "horde_text_give_backs",
    "Text generations a worker gave back (a submit with state faulted): restarted, and counted as aborts.",
    ("trust",),
    tuple((t,) for t in TRUST_LABELS),
)
# Why a call was answered 429: a requester route's key or address token bucket, an address's
# bucket spent on bad keys at the worker routes, the kudos transfers' buckets, or the account's
# bound of waiting requests (`errors.DomainError.refusal`).
REFUSAL_REASONS = ("rate_limit", "bad_keys", "transfers", "waiting_requests")
REFUSALS_429 = HordeCounter(
    "horde_refusals_429",
    "Calls answered 429, by reason: rate_limit, bad_keys, transfers, waiting_requests.",
    ("reason",),
    tuple((r,) for r in REFUSAL_REASONS),
)
# How a webhook's delivery ended (jobs/webhooks.py): posted, its last try failed, its address
# refused at the call, or dropped with the queue full.
WEBHOOK_OUTCOMES = ("delivered", "gave_up", "refused", "dropped")
WEBHOOK_DELIVERIES = HordeCounter(
    "horde_webhook_deliveries",
    "Webhook deliveries by outcome: delivered, gave_up (3 tries failed), refused, dropped (queue full).",
    ("outcome",),
    tuple((o,) for o in WEBHOOK_OUTCOMES),
)
COUNTERS = (
    LEASE_RENEWALS,
    STALE_ABORTS,
    POP_LEASE_CAPACITY_LIMITED,
    TIMED_OUT_REFUSALS,
    GIVE_BACKS,
    REFUSALS_429,
    WEBHOOK_DELIVERIES,
)


def count_refusal(err) -> None:
    """Count a 429 by its reason (every error shape calls this as it answers a domain error)."""
    if err.status == 429 and getattr(err, "refusal", None) in REFUSAL_REASONS:
        increment_soon(REFUSALS_429, err.refusal, now=clock.now())


def trust_label(trusted: bool) -> str:
    return "trusted" if trusted else "untrusted"


def _redis():
    from django_redis import get_redis_connection

    return get_redis_connection("default")


def minute_key(now: datetime) -> str:
    return f"{MINUTE_KEY_PREFIX}{int(now.timestamp()) // 60}"


def increment(counter: HordeCounter, *values: str, amount: int = 1, now: datetime) -> None:
    _write(Counter({(counter.field(*values), minute_key(now)): amount}), _redis())


def increment_soon(counter: HordeCounter, *values: str, amount: int = 1, now: datetime) -> None:
    """Count, written to Redis within METRICS_FLUSH_SECONDS with the process's other pending
    counts (at once where that is 0). For counts made on a hot route."""
    if settings.METRICS_FLUSH_SECONDS <= 0:
        increment(counter, *values, amount=amount, now=now)
    else:
        pending.add(counter.field(*values), minute_key(now), amount)


def _write(counts: Counter[tuple[str, str]], client) -> None:
    """Add counts, keyed by (field, minute key), to the totals and the minutes: one round trip."""
    pipe = client.pipeline(transaction=False)
    for (field, bucket), amount in counts.items():
        pipe.hincrby(METRICS_KEY, field, amount)
        pipe.hincrby(bucket, field, amount)
    for bucket in {bucket for _, bucket in counts}:
        pipe.expire(bucket, MINUTE_KEY_TTL_SECONDS)
    pipe.execute()


class PendingCounts:
    """This process's counts not yet in Redis, written by a thread of its own every
    METRICS_FLUSH_SECONDS, at exit, and before a read. A write that fails (Redis down) keeps
    them for the next one: a few fields a minute, so what waits stays small."""

    def __init__(self, client: Callable[[], Any] | None = None) -> None:
        self._client = client or _redis  # called on the writing thread: clients are per thread
        self._lock = threading.Lock()
        self._counts: Counter[tuple[str, str]] = Counter()
        self._thread: threading.Thread | None = None
        os.register_at_fork(after_in_child=self.forget)

    def add(self, field: str, bucket: str, amount: int) -> None:
        with self._lock:
            self._counts[(field, bucket)] += amount
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="hordeops-metrics", daemon=True)
                self._thread.start()

    def flush(self) -> None:
        with self._lock:
            counts, self._counts = self._counts, Counter()
        if not counts:
            return
        try:
            _write(counts, self._client())
        except BaseException:
            with self._lock:
                self._counts.update(counts)
            raise

    def flush_quietly(self) -> None:
        try:
            self.flush()
        except Exception as error:
            logger.warning("Pending counts not written to Redis (%s): kept.", type(error).__name__)

    def forget(self) -> None:
        """In a forked child: the parent writes what it had counted; the child starts empty."""
        self._lock = threading.Lock()
        self._counts = Counter()
        self._thread = None

    def _run(self) -> None:
        while True:
            # With no interval (0) counts are written at once and this only picks up what is
            # left: a second's sleep, not a loop that spins (a negative sleep would end it).
            seconds = settings.METRICS_FLUSH_SECONDS
            time.sleep(seconds if seconds > 0 else 1.0)
            self.flush_quietly()


logger = logging.getLogger(__name__)
pending = PendingCounts()
atexit.register(pending.flush_quietly)


def value(counter: HordeCounter, *values: str) -> int:
    pending.flush()
    raw = _redis().hget(METRICS_KEY, counter.field(*values))
    return int(raw or 0)


def per_minute(*, now: datetime, minutes: int = 60) -> dict[str, list[int]]:
    """Each counter field's counts in the last `minutes` minutes, oldest first, the current one last."""
    current = int(now.timestamp()) // 60
    pending.flush()
    pipe = _redis().pipeline(transaction=False)
    for minute in range(current - minutes + 1, current + 1):
        pipe.hgetall(f"{MINUTE_KEY_PREFIX}{minute}")
    buckets = pipe.execute()
    fields = [c.field(*labels) for c in COUNTERS for labels in c.label_sets]
    return {f: [int(b.get(f.encode(), 0)) for b in buckets] for f in fields}


def counting_since(*, now: datetime) -> float:
    """When the totals started (Unix seconds): now, for totals that Redis lost or never had."""
    client = _redis()
    client.hsetnx(METRICS_KEY, CREATED_FIELD, repr(now.timestamp()))
    return float(client.hget(METRICS_KEY, CREATED_FIELD))


class RedisCounterCollector(Collector):
    def collect(self) -> Iterator[CounterMetricFamily]:
        try:
            pending.flush()
            stored = {k.decode(): v for k, v in _redis().hgetall(METRICS_KEY).items()}
            # Marked by the first scrape that finds it missing; read with the totals otherwise.
            created = (
                float(stored[CREATED_FIELD]) if CREATED_FIELD in stored else counting_since(now=clock.now())
            )
        except Exception:
            # A scrape must not fail because Redis is down; the counters are then absent.
            return
        for counter in COUNTERS:
            family = CounterMetricFamily(counter.name, counter.documentation, labels=counter.labels)
            for label_set in counter.label_sets:
                count = int(stored.get(counter.field(*label_set), 0))
                family.add_metric(list(label_set), count, created=created)
            yield family


_collector: RedisCounterCollector | None = None


def register() -> None:
    """Register the collector once per process (from AppConfig.ready)."""
    global _collector
    if _collector is None and getattr(settings, "REDIS_URL", None):
        _collector = RedisCounterCollector()
        REGISTRY.register(_collector)


class DatabaseGauge(Collector):
    """A gauge read from the database when `/metrics` is scraped: `read(now)` gives its value by
    label values. Absent from a scrape while the database is down, rather than failing it."""

    def __init__(
        self,
        name: str,
        documentation: str,
        read: Callable[[datetime], dict[tuple[str, ...], float]],
        labels=(),
    ) -> None:
        self.name, self.documentation, self.read, self.labels = name, documentation, read, list(labels)

    def describe(self) -> Iterator[GaugeMetricFamily]:
        # What registering it asks for (else it would collect, and query, at start-up).
        yield GaugeMetricFamily(self.name, self.documentation, labels=self.labels)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        try:
            values = self.read(clock.now())
        except Exception:
            return
        gauge = GaugeMetricFamily(self.name, self.documentation, labels=self.labels)
        for label_values, value in sorted(values.items()):
            gauge.add_metric(list(label_values), value)
        yield gauge


_gauges: set[str] = set()


def register_gauge(gauge: DatabaseGauge) -> None:
    """Register a database gauge once per process (from an app's AppConfig.ready)."""
    if gauge.name not in _gauges:
        _gauges.add(gauge.name)
        REGISTRY.register(gauge)
