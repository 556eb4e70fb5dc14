"""Where the horde's PostgreSQL and Redis are, and how every client reaches them: Django's
database (its pool and statements), the read replica, the cache (and with it every django-redis
client) and Celery's broker, each through Redis Sentinel when REDIS_SENTINELS is set.

`hordeops.settings` takes every setting of this module; like it, this module reads each one
from an environment variable (through `hordeops.env`).
"""

import re
from urllib.parse import urlsplit, urlunsplit

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

from hordeops.env import env_float, env_host_ports, env_int, env_never_or_int, env_str

# The longest any request waits for a pooled connection: an outage answers 503 this soon.
DATABASE_POOL_WAIT_SECONDS = env_float("DATABASE_POOL_WAIT_SECONDS", 2.0)


# How often a web process that follows open chat requests checks that PostgreSQL answers
# (jobs/relay_hub.py): with the database gone, their streams end with an error event this soon.
DATABASE_WATCH_SECONDS = env_float("DATABASE_WATCH_SECONDS", 1.0)


# How many runs of a statement on one connection before psycopg prepares it; empty: never (for
# PgBouncer in transaction mode: docs/reference/operations.md, "Running on several machines").
DATABASE_PREPARE_THRESHOLD = env_never_or_int("DATABASE_PREPARE_THRESHOLD", 5)


# How long a connection's peer may stay silent before the connection is given up (libpq's
# TCP keepalives, and `tcp_user_timeout` for what was sent and never acknowledged): a PostgreSQL
# host that vanished from the network (a power cut, a partition) fails its connections this
# soon instead of holding their requests until the kernel gives up, many minutes later.
DATABASE_DEAD_PEER_SECONDS = env_int("DATABASE_DEAD_PEER_SECONDS", 10)


# While the primary cannot be reached but a standby of it answers (a failover under way: Patroni
# promotes one), open chat requests wait this long for the new primary before their streams end
# with the error event an outage gives them. 0: they end at once, as in an outage.
DATABASE_FAILOVER_SECONDS = env_float("DATABASE_FAILOVER_SECONDS", 30.0)


def _hosts(netloc: str) -> tuple[str, list[tuple[str, str]]]:
    """A URL's userinfo and its hosts, each (host, port): libpq's multi-host form
    `user@h1:5432,h2:5432` names several, tried in order (`target_session_attrs` says which
    will do)."""
    userinfo, _, hostlist = netloc.rpartition("@")
    hosts = []
    for item in hostlist.split(","):
        host, port = item, ""
        if match := re.fullmatch(r"(\[[^\]]*\]|[^:]*)(?::(\d*))?", item):
            host, port = match.group(1), match.group(2) or ""
        hosts.append((host.strip("[]"), port))
    return userinfo, hosts


def database_from_url(url: str) -> dict:
    """The database of a postgres:// URL, read by dj-database-url: the libpq parameters of its
    query string (`sslmode`, `target_session_attrs`, ...) are kept beside the backend, pool and
    statement settings. Several hosts (`h1:5432,h2:5432`) are kept as libpq takes them: HOST and
    PORT comma-separated lists."""
    split = urlsplit(url)
    if split.scheme not in {"postgres", "postgresql"}:
        raise ImproperlyConfigured("DATABASE_URL must be a postgres:// URL")
    userinfo, hosts = _hosts(split.netloc)
    if len(hosts) > 1:
        # dj-database-url reads one host: it is given the first, and the list is put back after.
        first = f"{userinfo}@localhost" if userinfo else "localhost"
        url = urlunsplit(split._replace(netloc=first))
    parsed = dj_database_url.parse(url, engine="hordeops.db")
    if len(hosts) > 1:
        parsed["HOST"] = ",".join(host or "127.0.0.1" for host, _ in hosts)
        parsed["PORT"] = ",".join(port or "5432" for _, port in hosts)
    given = parsed.get("OPTIONS", {})
    return {
        # Django's PostgreSQL backend, its pool's wait bounded per request (hordeops/dbwait.py)
        # and each connection checked as it is handed out, so that after a PostgreSQL restart
        # no request gets one the restart closed (hordeops/db/base.py).
        "ENGINE": "hordeops.db",
        "NAME": parsed["NAME"] or "hordeops",
        "USER": parsed["USER"] or "postgres",
        "PASSWORD": parsed["PASSWORD"] or "",
        "HOST": parsed["HOST"] or "127.0.0.1",
        "PORT": str(parsed["PORT"] or 5432),
        # Under ASGI each request's sync code may run on a thread of its own, so persistent
        # per-thread connections would pile up; a process-wide pool reuses them instead.
        "CONN_MAX_AGE": 0,
        "OPTIONS": {
            **given,
            # Each host's: libpq tries the next one after it.
            "connect_timeout": int(given.get("connect_timeout", 5)),
            **_dead_peer(given),
            # JIT would compile the pop on every call (its cost estimate, inflated by the speed
            # gate's NOT EXISTS, crosses jit_above_cost), which costs far more than running it.
            "options": " ".join(filter(None, (given.get("options"), "-c jit=off"))),
            # Parameters travel apart from the SQL, and psycopg prepares a statement that a
            # connection runs a fifth time (the hot routes'), so that PostgreSQL parses it once
            # and then reuses a generic plan where it is as good as planning each call (the
            # pop's is, thanks to its plan hint: see jobs.sql.pop). Behind a pooler in
            # transaction mode (PgBouncer before 1.21) a statement prepared on one server
            # connection is missing on the next: DATABASE_PREPARE_THRESHOLD empty prepares none.
            "server_side_binding": True,
            "prepare_threshold": DATABASE_PREPARE_THRESHOLD,
            "pool": {
                "min_size": env_int("DATABASE_POOL_MIN_SIZE", 2),
                "max_size": env_int("DATABASE_POOL_MAX_SIZE", 20),
                # hordeops.db passes each wait's own bound; this is the same setting's.
                "timeout": DATABASE_POOL_WAIT_SECONDS,
                # A failed connection attempt is retried with a doubling delay for this long,
                # then dropped, and the next request that needs a connection starts afresh:
                # without it the pool was still backing off (1, 2, 4, 8 s...) long after
                # PostgreSQL came back, and answered 503 meanwhile.
                "reconnect_timeout": DATABASE_POOL_WAIT_SECONDS,
            },
        },
        "TEST": {"NAME": env_str("TEST_DATABASE_NAME", "test_hordeops")},
    }


def _dead_peer(given: dict) -> dict:
    """libpq's keepalives and `tcp_user_timeout` from DATABASE_DEAD_PEER_SECONDS (the URL's
    own values win): a third of it idle, then probes a second apart, the rest for the probes."""
    seconds = DATABASE_DEAD_PEER_SECONDS
    if seconds <= 0:
        return {}
    idle = max(1, seconds // 3)
    defaults = {
        "keepalives": 1,
        "keepalives_idle": idle,
        "keepalives_interval": 1,
        "keepalives_count": max(1, seconds - idle),
        "tcp_user_timeout": seconds * 1000,
    }
    return {name: given.get(name, value) for name, value in defaults.items()}


DATABASE_URL = env_str("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/hordeops")
REDIS_URL = env_str("REDIS_URL", "redis://127.0.0.1:6379/0")
# Redis Sentinel: where the sentinels answer, and the name they monitor the primary by. Set, every
# Redis client of the project asks them for the primary (its database: REDIS_URL's number).
REDIS_SENTINELS = env_host_ports("REDIS_SENTINELS")
REDIS_SENTINEL_SERVICE = env_str("REDIS_SENTINEL_SERVICE", "mymaster")
REDIS_DB = int(urlsplit(REDIS_URL).path.strip("/") or 0)

DATABASES = {"default": database_from_url(DATABASE_URL)}
# A streaming replica of it: the reads a route allows there (hordeops/replica.py) go to it.
DATABASE_REPLICA_URL = env_str("DATABASE_REPLICA_URL", "")
if DATABASE_REPLICA_URL:
    # Tests read the primary under this name too: a replica cannot hold a test database.
    DATABASES["replica"] = {**database_from_url(DATABASE_REPLICA_URL), "TEST": {"MIRROR": "default"}}
DATABASE_ROUTERS = ["hordeops.replica.ReplicaRouter"]

CACHES = {
    "default": {
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": REDIS_URL,
        "OPTIONS": {
            "SOCKET_CONNECT_TIMEOUT": 2,
            "SOCKET_TIMEOUT": 2,
        },
    }
}

if REDIS_SENTINELS:
    # django-redis' own Sentinel support: a pool that asks the sentinels for the primary and
    # asks again when it fails over.
    DJANGO_REDIS_CONNECTION_FACTORY = "django_redis.pool.SentinelConnectionFactory"
    CACHES["default"]["LOCATION"] = f"redis://{REDIS_SENTINEL_SERVICE}/{REDIS_DB}"
    CACHES["default"]["OPTIONS"] |= {
        "CLIENT_CLASS": "django_redis.client.SentinelClient",
        "SENTINELS": REDIS_SENTINELS,
        "SENTINEL_KWARGS": {"socket_timeout": 2},
    }

# Celery's broker: Redis (Celery's own settings are in hordeops.settings).
CELERY_BROKER_URL = REDIS_URL
if REDIS_SENTINELS:
    # kombu's sentinel transport: each sentinel a URL, the primary found by its name.
    CELERY_BROKER_URL = ";".join(f"sentinel://{host}:{port}/{REDIS_DB}" for host, port in REDIS_SENTINELS)
    CELERY_BROKER_TRANSPORT_OPTIONS = {"master_name": REDIS_SENTINEL_SERVICE}

# What `hordeops.settings` takes: the settings (upper case names) and the URL reader its tests use.
__all__ = ["database_from_url", *(name for name in dir() if name.isupper())]
