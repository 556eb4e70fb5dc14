"""The workers' gauges on `/metrics`, read from the database at scrape time."""

from collections.abc import Iterator

from prometheus_client.core import REGISTRY, GaugeMetricFamily
from prometheus_client.registry import Collector

from hordeops import clock

CAPACITY_LIMITED_ONLINE = "horde_workers_capacity_limited_online"


def capacity_limited_online(*, now) -> int:
    """Online chat workers whose capacity is below the max_length they declare, now."""
    from workers.models import Worker

    return Worker.objects.online(now).capacity_limited().count()


class WorkerGaugeCollector(Collector):
    """The capacity-limited workers online now: a gauge, beside the counter of their pops
    (`horde_pop_lease_capacity_limited`, the speed gate's), which counts every poll of such a
    worker, so that one slow worker polling idle adds 30 a minute."""

    def describe(self) -> Iterator[GaugeMetricFamily]:
        # What registering it asks for (else it would collect, and query, at start-up).
        yield self._gauge()

    def collect(self) -> Iterator[GaugeMetricFamily]:
        try:
            count = capacity_limited_online(now=clock.now())
        except Exception:
            # A scrape must not fail because PostgreSQL is down; the gauge is then absent.
            return
        gauge = self._gauge()
        gauge.add_metric([], count)
        yield gauge

    @staticmethod
    def _gauge() -> GaugeMetricFamily:
        return GaugeMetricFamily(
            CAPACITY_LIMITED_ONLINE,
            "Online chat workers whose capacity (speed x lease window) is below the max_length they declare.",
        )


_collector: WorkerGaugeCollector | None = None


def register() -> None:
    """Register the collector once per process (from AppConfig.ready)."""
    global _collector
    if _collector is None:
        _collector = WorkerGaugeCollector()
        REGISTRY.register(_collector)
