"""The suite in shards (pytest-xdist, `bin/test` runs two): each worker its own Redis database.

pytest-django gives each worker a test database of its own (`test_hordeops_gw0`, `_gw1`); Redis
has no such suffix, so worker k takes database N - k of `REDIS_URL`'s server (15 and 14 under
`bin/test`). Loaded with `-p` (pyproject.toml), before Django reads its settings, so the web
processes, Celery workers and bridges the tests start inherit it.

Each test file runs whole on one worker (its module fixtures are built once), and the bridge's
files together on one (they share a session's bridge virtualenv and engine model).
"""

import os

import pytest

_worker = os.environ.get("PYTEST_XDIST_WORKER", "")
if _worker.startswith("gw"):
    _url = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/15")
    _server, _, _db = _url.rpartition("/")
    _shard_db = int(_db or 0) - int(_worker[2:])
    if _shard_db < 1:  # database 0 is a running stack's: the tests empty theirs
        raise pytest.UsageError(f"REDIS_URL {_url} leaves no Redis database for xdist worker {_worker}")
    os.environ["REDIS_URL"] = f"{_server}/{_shard_db}"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        path = item.nodeid.split("::", 1)[0]
        group = "tests/bridge" if path.startswith("tests/bridge/") else path
        item.add_marker(pytest.mark.xdist_group(group))
