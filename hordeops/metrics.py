"""The horde's counters, kept in Redis so that every process adds to the same total.

The stale pass runs in a Celery worker and progress posts in any of several web processes,
yet `/metrics` on any web process must show them all: so the counters live in one Redis
hash, incremented by whoever counts (the lease Lua script increments renewals itself), and
a collector reads the hash at scrape time. Every label set is exported from the start.
"""

from collections.abc import Iterator
from dataclasses import dataclass

from django.conf import settings
from prometheus_client.core import REGISTRY, CounterMetricFamily
from prometheus_client.registry import Collector

METRICS_KEY = "hordeops:metrics"
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
COUNTERS = (LEASE_RENEWALS, STALE_ABORTS, POP_LEASE_CAPACITY_LIMITED)


def trust_label(trusted: bool) -> str:
    return "trusted" if trusted else "untrusted"


def _redis():
    from django_redis import get_redis_connection

    return get_redis_connection("default")


def increment(counter: HordeCounter, *values: str, amount: int = 1) -> None:
    _redis().hincrby(METRICS_KEY, counter.field(*values), amount)


def value(counter: HordeCounter, *values: str) -> int:
    raw = _redis().hget(METRICS_KEY, counter.field(*values))
    return int(raw or 0)


class RedisCounterCollector(Collector):
    def collect(self) -> Iterator[CounterMetricFamily]:
        try:
            stored = {k.decode(): int(v) for k, v in _redis().hgetall(METRICS_KEY).items()}
        except Exception:
            # A scrape must not fail because Redis is down; the counters are then absent.
            return
        for counter in COUNTERS:
            family = CounterMetricFamily(counter.name, counter.documentation, labels=counter.labels)
            for label_set in counter.label_sets:
                family.add_metric(list(label_set), stored.get(counter.field(*label_set), 0))
            yield family


_collector: RedisCounterCollector | None = None


def register() -> None:
    """Register the collector once per process (from AppConfig.ready)."""
    global _collector
    if _collector is None and getattr(settings, "REDIS_URL", None):
        _collector = RedisCounterCollector()
        REGISTRY.register(_collector)
