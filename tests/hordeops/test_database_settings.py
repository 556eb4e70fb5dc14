"""Connection settings: the database URL, and what the pop relies on."""

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.db import connection

from hordeops.settings_connections import database_from_url


def test_connections_run_without_jit(db):
    # The pop is a ~1 ms indexed query whose cost estimate crosses jit_above_cost; compiling
    # it each time would cost tens to hundreds of milliseconds (the retired pop_scale
    # study, docs/benchmarks.md).
    with connection.cursor() as cursor:
        cursor.execute("SHOW jit")
        assert cursor.fetchone() == ("off",)


def test_a_database_url_keeps_its_libpq_parameters_beside_the_hordes_own():
    database = database_from_url(
        "postgresql://horde:p%40ss@db.example:6432/prod?sslmode=require&options=-c%20statement_timeout%3D5000"
    )
    assert (database["NAME"], database["USER"], database["PASSWORD"]) == ("prod", "horde", "p@ss")
    assert (database["HOST"], database["PORT"], database["ENGINE"]) == ("db.example", "6432", "hordeops.db")
    options = database["OPTIONS"]
    assert options["sslmode"] == "require"
    assert options["options"] == "-c statement_timeout=5000 -c jit=off"
    assert options["prepare_threshold"] == 5 and options["pool"]["max_size"] >= 1


def test_a_bare_database_url_takes_the_local_defaults():
    database = database_from_url("postgres:///")
    assert (database["NAME"], database["USER"], database["HOST"], database["PORT"]) == (
        "hordeops",
        "postgres",
        "127.0.0.1",
        "5432",
    )
    assert database["OPTIONS"]["options"] == "-c jit=off"


@pytest.mark.parametrize("url", ["mysql://root@localhost/horde", "sqlite:///horde.db", "not a url"])
def test_a_database_url_that_is_not_postgresql_is_refused(url):
    with pytest.raises(ImproperlyConfigured, match="postgres://"):
        database_from_url(url)


def test_the_prepare_threshold_is_5_unset_a_count_when_given_and_never_when_empty(monkeypatch):
    from hordeops.env import env_never_or_int

    monkeypatch.delenv("DATABASE_PREPARE_THRESHOLD", raising=False)
    assert env_never_or_int("DATABASE_PREPARE_THRESHOLD", 5) == 5
    monkeypatch.setenv("DATABASE_PREPARE_THRESHOLD", "")
    assert env_never_or_int("DATABASE_PREPARE_THRESHOLD", 5) is None
    monkeypatch.setenv("DATABASE_PREPARE_THRESHOLD", "0")
    assert env_never_or_int("DATABASE_PREPARE_THRESHOLD", 5) == 0
    for bad in ("-1", "five"):
        monkeypatch.setenv("DATABASE_PREPARE_THRESHOLD", bad)
        with pytest.raises(ImproperlyConfigured, match="DATABASE_PREPARE_THRESHOLD"):
            env_never_or_int("DATABASE_PREPARE_THRESHOLD", 5)


def test_redis_sentinels_are_host_port_pairs_and_anything_else_is_refused(monkeypatch):
    from hordeops.env import env_host_ports

    monkeypatch.setenv("REDIS_SENTINELS", "10.0.0.1:26379, sentinel-b:26380,[fd00::3]:26381")
    assert env_host_ports("REDIS_SENTINELS") == [
        ("10.0.0.1", 26379),
        ("sentinel-b", 26380),
        ("fd00::3", 26381),
    ]
    monkeypatch.setenv("REDIS_SENTINELS", "")
    assert env_host_ports("REDIS_SENTINELS") == []
    for bad in ("10.0.0.1", "10.0.0.1:port", ":26379"):
        monkeypatch.setenv("REDIS_SENTINELS", bad)
        with pytest.raises(ImproperlyConfigured, match="REDIS_SENTINELS"):
            env_host_ports("REDIS_SENTINELS")


def test_a_multi_host_database_url_keeps_every_host_for_libpq_to_try_in_order():
    database = database_from_url(
        "postgres://horde:pw@10.0.0.31:5432,pg2.example,[fd00::33]:6432/prod?target_session_attrs=read-write"
    )
    assert (database["HOST"], database["PORT"]) == ("10.0.0.31,pg2.example,fd00::33", "5432,5432,6432")
    assert (database["NAME"], database["USER"], database["PASSWORD"]) == ("prod", "horde", "pw")
    assert database["OPTIONS"]["target_session_attrs"] == "read-write"


def test_a_dead_peer_fails_its_connection_within_the_bound_unless_the_url_says_otherwise():
    options = database_from_url("postgres://db.example/prod")["OPTIONS"]
    assert options["tcp_user_timeout"] == 10_000  # DATABASE_DEAD_PEER_SECONDS, in milliseconds
    # Keepalives: idle, then one probe a second; all of it within the bound.
    assert options["keepalives_idle"] + options["keepalives_count"] * options["keepalives_interval"] <= 10
    given = database_from_url("postgres://db.example/prod?keepalives_idle=60")["OPTIONS"]
    assert given["keepalives_idle"] == 60
