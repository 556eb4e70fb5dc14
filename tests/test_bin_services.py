"""bin/services makes the database where DATABASE_URL points: its server's port, user and name."""

import os
import subprocess
import uuid
from pathlib import Path

import psycopg
import redis

from tests.live import free_port

ROOT = Path(__file__).resolve().parents[1]


def _databases(port: int) -> set[str]:
    with psycopg.connect(host="127.0.0.1", port=port, user="postgres", dbname="postgres") as conn:
        return {name for (name,) in conn.execute("SELECT datname FROM pg_database")}


def _services(database_url: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "DATABASE_URL": database_url}
    return subprocess.run(
        [str(ROOT / "bin" / "services")], env=env, cwd=ROOT, capture_output=True, text=True, timeout=120
    )


def test_the_database_is_made_on_the_urls_server_and_port_not_the_default_one(private_postgres):
    name = f"svc_{uuid.uuid4().hex[:10]}"
    done = _services(f"postgres://postgres@127.0.0.1:{private_postgres.port}/{name}?sslmode=disable")
    assert done.returncode == 0, done.stderr
    assert name in _databases(private_postgres.port)
    assert name not in _databases(5432)
    assert _services(f"postgres://postgres@127.0.0.1:{private_postgres.port}/{name}").returncode == 0  # again


def test_a_server_that_does_not_answer_is_named_not_started(private_postgres):
    port = private_postgres.port
    private_postgres.stop()
    done = _services(f"postgres://postgres@127.0.0.1:{port}/hordeops")
    assert done.returncode != 0
    assert f"PostgreSQL is not running on 127.0.0.1:{port}" in done.stderr


def test_redis_is_checked_and_started_where_redis_url_points_not_on_6379(private_postgres):
    port = free_port()
    env = {
        **os.environ,
        "DATABASE_URL": f"postgres://postgres@127.0.0.1:{private_postgres.port}/hordeops",
        "REDIS_URL": f"redis://127.0.0.1:{port}/3",
    }
    try:
        done = subprocess.run(
            [str(ROOT / "bin" / "services")], env=env, cwd=ROOT, capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, done.stderr
        assert f"starting Redis on port {port}" in done.stdout
        assert redis.Redis(port=port).ping()
    finally:
        # The server bin/services started for this test, and only it.
        subprocess.run(["redis-cli", "-p", str(port), "shutdown", "nosave"], capture_output=True, timeout=30)


def test_a_redis_elsewhere_that_does_not_answer_is_named_not_started(private_postgres):
    env = {
        **os.environ,
        "DATABASE_URL": f"postgres://postgres@127.0.0.1:{private_postgres.port}/hordeops",
        "REDIS_URL": "redis://redis.invalid:6390/0",
    }
    done = subprocess.run(
        [str(ROOT / "bin" / "services")], env=env, cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode != 0
    assert "Redis is not running on redis.invalid:6390" in done.stderr
