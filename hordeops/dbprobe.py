"""Is PostgreSQL there? An asyncio probe on a connection of its own, outside the pool.

A web process whose open chat requests wait on Redis would not otherwise notice that the
database has gone: their workers' posts fail, and the requesters would wait for output that
cannot come. The relay hub (`jobs.relay_hub`) asks this probe once a second while it follows any
request. The probe owns one connection, so that it neither waits behind the pool nor takes a
connection from a request; a connection lost is tried again at once, so that only a database
that cannot be reached now reads as down, not a connection that a restart closed.
"""

import asyncio

import psycopg
from django.db import DEFAULT_DB_ALIAS, connections


class DatabaseProbe:
    def __init__(self, *, timeout: float) -> None:
        self.timeout = timeout
        self._connection: psycopg.AsyncConnection | None = None

    def _params(self) -> dict:
        db = connections[DEFAULT_DB_ALIAS].settings_dict
        params = {
            "dbname": db["NAME"],
            "user": db["USER"],
            "password": db["PASSWORD"],
            "host": db["HOST"],
            "port": db["PORT"],
            "connect_timeout": max(1, round(self.timeout)),
            "application_name": "hordeops-database-probe",
        }
        return {name: value for name, value in params.items() if value}

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

    async def close(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None:
            try:
                await connection.close()
            except (psycopg.Error, OSError):
                pass
