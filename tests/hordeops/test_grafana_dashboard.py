"""docs/grafana/hordeops-dashboard.json: valid, and every metric it queries is exported."""

import json
import re
from pathlib import Path

from rest_framework.test import APIClient

from tests.hordeops.test_metrics import scrape

DASHBOARD = Path(__file__).resolve().parents[2] / "docs" / "grafana" / "hordeops-dashboard.json"
METRIC = re.compile(r"\b((?:horde|django)_[a-z_]+)\b")


def test_every_metric_the_dashboard_queries_is_on_the_scrape(db):
    APIClient().get("/api/v2/status/heartbeat")  # so that the per-view families have samples
    exported = {name for name, _labels in scrape()}
    dashboard = json.loads(DASHBOARD.read_text())
    queried = {
        name
        for panel in dashboard["panels"]
        for target in panel["targets"]
        for name in METRIC.findall(target["expr"])
    }
    assert {"horde_text_lease_renewals_total", "horde_text_stale_aborts_total"} <= queried
    assert "horde_pop_lease_capacity_limited_total" in queried
    assert "horde_workers_capacity_limited_online" in queried
    assert queried - exported == set()


def test_the_horde_counters_are_read_with_max_not_sum_across_processes():
    # Every process exports the same Redis-held totals: summing instances would multiply them.
    dashboard = json.loads(DASHBOARD.read_text())
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            if "horde_" in target["expr"]:
                assert target["expr"].startswith("max without (instance, pod)"), panel["title"]
