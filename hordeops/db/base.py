"""Django's PostgreSQL backend, with the pool's wait for a connection bounded per request and
each pooled connection checked as it is handed out."""

import time

from django.db.backends.postgresql import base
from psycopg import IsolationLevel
from psycopg_pool import ConnectionPool, PoolTimeout

from hordeops import dbwait, errors


class DatabaseWrapper(base.DatabaseWrapper):
    def get_new_connection(self, conn_params):
        if not self.pool:
            return super().get_new_connection(conn_params)
        # What Django's does with a pool, bar the wait: settings set no isolation level.
        self.isolation_level = IsolationLevel.READ_COMMITTED
        self.pool.open()
        wait = dbwait.current()
        try:
            return self._working_connection(time.monotonic() + wait.seconds)
        except PoolTimeout:
            if wait.by_deadline:
                raise errors.GenerationDeadlineExceeded() from None
            raise

    def _working_connection(self, deadline: float):
        """A pooled connection that answers (one empty round trip), by `deadline`.

        Checked here, not by the pool's own `check`: that one sleeps a second, then two, after
        each dead connection, so that the first request after a PostgreSQL restart, finding
        the pool's idle connections all closed, timed out. A dead one is given back at once
        (the pool discards and replaces it) and the next one taken.
        """
        for _ in range(self.pool.max_size + 1):
            conn = self.pool.getconn(timeout=max(0.0, deadline - time.monotonic()))
            try:
                ConnectionPool.check_connection(conn)
            except Exception:
                self.pool.putconn(conn)
                continue
            return conn
        raise PoolTimeout("no pooled connection answered")
