"""Is PostgreSQL there? An asyncio probe on a connection of its own, outside the pool.

A web process whose open chat requests wait on Redis would not otherwise notice that the
database has gone: their workers' posts fail, and the requesters would wait for output that
cannot come. The relay hub (`jobs.relay_hub`) asks this probe once a second while it follows any
request. The probe owns one connection, so that it neither waits behind the pool nor takes a
connection from a request; a connection lost is tried again at once, so that only a database
that cannot be reached now reads as down, not a connection that a restart closed.

A primary that cannot be reached while a standby of it answers is a failover under way (Patroni
promoting one): `standby_answers` tells it apart from an outage, so that the hub lets streams
wait for the new primary, for a bound.
"""

import asyncio

import psycopg
from django.db import DEFAULT_DB_ALIAS, connections

# The libpq parameters of the database's settings that say where and how to connect: the
# hosts to try and which will do (`target_session_attrs`), TLS, and the dead-peer bounds.
_LIBPQ = (
    "target_session_attrs",
    "load_balance_hosts",
    "sslmode",
    "sslrootcert",
    "sslcert",
    "sslkey",
    "keepalives",
    "keepalives_idle",
    "keepalives_interval",
    "keepalives_count",
    "tcp_user_timeout",
)


def _params(alias: str, timeout: float) -> dict:
    db = connections[alias].settings_dict
    params = {
        "dbname": db["NAME"],
        "user": db["USER"],
        "password": db["PASSWORD"],
        "host": db["HOST"],
        "port": db["PORT"],
        "connect_timeout": max(1, round(timeout)),
        "application_name": "hordeops-database-probe",
        **{name: db["OPTIONS"][name] for name in _LIBPQ if name in db.get("OPTIONS", {})},
    }
    return {name: value for name, value in params.items() if value not in (None, "")}


class DatabaseProbe:
    def __init__(self, *, timeout: float) -> None:
        self.timeout = timeout
        self._connection: psycopg.AsyncConnection | None = None

    def _params(self) -> dict:
        return _params(DEFAULT_DB_ALIAS, self.timeout)

    async def _ask(self) -> None:
        if self._connection is None or self._connection.closed:
            self._connection = await psycopg.AsyncConnection.connect(autocommit=True, **self._params())
        await self._connection.execute("SELECT 1")

    async def alive(self) -> bool:
        """Whether PostgreSQL answers within the timeout, on the probe's connection or a new one."""
        for _ in range(2):  # a connection a restart closed is replaced once
            try:
                await asyncio.wait_for(self._ask(), timeout=self.timeout)
                return True
            except (psycopg.Error, OSError, TimeoutError):
                await self.close()
        return False

    async def standby_answers(self) -> bool:
        """Whether a standby of the primary answers (on a connection made for the question): the
        replica's settings when DATABASE_REPLICA_URL is set, else any host of DATABASE_URL's
        list. A single host that is down answers no."""
        alias = "replica" if "replica" in connections.settings else DEFAULT_DB_ALIAS
        params = {**_params(alias, self.timeout), "target_session_attrs": "standby"}

        async def ask() -> bool:
            async with await psycopg.AsyncConnection.connect(autocommit=True, **params) as conn:
                cursor = await conn.execute("SELECT pg_is_in_recovery()")
                return bool((await cursor.fetchone())[0])

        try:
            return await asyncio.wait_for(ask(), timeout=self.timeout)
        except (psycopg.Error, OSError, TimeoutError):
            return False

    async def close(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None:
            try:
                await connection.close()
            except (psycopg.Error, OSError):
                pass
