"""The queue's gauge on `/metrics`, read from the database at scrape time: how long the oldest
waiting request of each model has waited.

A request may name any model, so the models are labelled only where an online worker serves
them; the oldest request for a model no online worker serves is `unserved`, and one that names
no model is `any` (0 while none waits, so that the gauge is never empty). Read from the queue's
own table (`QueuedModel`, one row per waiting request and model it names): one aggregate
statement per scrape.
"""

from collections.abc import Iterator
from datetime import datetime

from django.db.models import Min
from prometheus_client.core import REGISTRY, GaugeMetricFamily
from prometheus_client.registry import Collector

from hordeops import clock

QUEUE_OLDEST = "horde_text_queue_oldest_seconds"
ANY_MODEL, UNSERVED = "any", "unserved"


def oldest_waiting(*, now: datetime) -> dict[str, float]:
    """Seconds the oldest waiting request of each model has waited (see the module)."""
    from jobs.models import QueuedModel
    from workers.models import Worker

    served = {
        m for models in Worker.objects.online(now).values_list("served_models", flat=True) for m in models
    }
    oldest: dict[str, float] = {ANY_MODEL: 0.0}  # always exported: 0 while nothing waits
    for model, created_at in (
        QueuedModel.objects.values("model").annotate(first=Min("created_at")).values_list("model", "first")
    ):
        label = ANY_MODEL if model == "" else model if model in served else UNSERVED
        waited = max(0.0, (now - created_at).total_seconds())
        oldest[label] = max(oldest.get(label, 0.0), waited)
    return oldest


class QueueGaugeCollector(Collector):
    def describe(self) -> Iterator[GaugeMetricFamily]:
        yield self._gauge()

    def collect(self) -> Iterator[GaugeMetricFamily]:
        try:
            oldest = oldest_waiting(now=clock.now())
        except Exception:
            # A scrape must not fail because PostgreSQL is down; the gauge is then absent.
            return
        gauge = self._gauge()
        for model, seconds in sorted(oldest.items()):
            gauge.add_metric([model], seconds)
        yield gauge

    @staticmethod
    def _gauge() -> GaugeMetricFamily:
        return GaugeMetricFamily(
            QUEUE_OLDEST,
            "Seconds the oldest waiting text request of each model has waited (models served by an "
            "online worker; 'any': names none; 'unserved': no online worker serves it).",
            labels=["model"],
        )


_collector: QueueGaugeCollector | None = None


def register() -> None:
    """Register the collector once per process (from AppConfig.ready)."""
    global _collector
    if _collector is None:
        _collector = QueueGaugeCollector()
        REGISTRY.register(_collector)
