"""The web processes' garbage collector: the app's objects frozen, the thresholds WEB_GC_THRESHOLDS."""

import json
import os
import signal
import subprocess

import pytest
from django.conf import settings as django_settings
from django.core.exceptions import ImproperlyConfigured

from hordeops.env import env_gc_thresholds
from tests.hordeops.test_keep_alive import ROOT, _free_port, heartbeat_connection
from tests.live import database_url


@pytest.mark.django_db(transaction=True)
def test_a_web_worker_freezes_what_the_app_loaded_and_takes_its_thresholds_from_the_setting(settings):
    # bin/web's gunicorn and worker class; the app is hordeops' with a route that reads the collector.
    port = _free_port()
    env = {**os.environ, "DATABASE_URL": database_url(), "REDIS_URL": settings.REDIS_URL,
           "WEB_GC_THRESHOLDS": "900,90,9"}  # fmt: skip
    server = subprocess.Popen(
        [str(ROOT / ".venv" / "bin" / "gunicorn"), "tests.hordeops.gc_app:application",
         "-k", "hordeops.web_worker.QuietUvicornWorker", "-w", "1", "-b", f"127.0.0.1:{port}",
         "--log-level", "warning"],
        env=env, cwd=ROOT, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        connection = heartbeat_connection(port)
        connection.request("GET", "/gc")
        state = json.loads(connection.getresponse().read())
        connection.close()
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.communicate(timeout=30)
    assert state["threshold"] == [900, 90, 9]
    # Django, DRF and the app's modules (about 100,000 objects); a process that froze nothing has 0.
    assert state["frozen"] > 50_000


def test_the_thresholds_default_to_pythons_with_a_tenth_as_many_promotions(monkeypatch):
    assert "WEB_GC_THRESHOLDS" not in os.environ  # the settings loaded with the default
    assert django_settings.WEB_GC_THRESHOLDS == (700, 100, 10)
    monkeypatch.setenv("WEB_GC_THRESHOLDS", " 2000, 50 ,20 ")
    assert env_gc_thresholds("WEB_GC_THRESHOLDS", (700, 100, 10)) == (2000, 50, 20)


@pytest.mark.parametrize(
    "raw",
    [
        "700,100",
        "700,100,10,5",
        "0,100,10",
        "700,-1,10",
        "700,1e2,10",
        "700,١٠٠,10",
        "700," + "9" * 20 + ",10",
    ],
)
def test_thresholds_that_are_not_three_positive_whole_numbers_refuse_to_load(monkeypatch, raw):
    # 0 turns automatic collection off: a process holding thousands of streams would only grow.
    monkeypatch.setenv("WEB_GC_THRESHOLDS", raw)
    with pytest.raises(ImproperlyConfigured, match="WEB_GC_THRESHOLDS"):
        env_gc_thresholds("WEB_GC_THRESHOLDS", (700, 100, 10))
