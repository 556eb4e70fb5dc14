"""Django's PostgreSQL backend, with the pool's wait for a connection bounded per request and
each pooled connection checked as it is handed out."""

import select
import time

from django.db.backends.postgresql import base
from psycopg import IsolationLevel, _queries
from psycopg_pool import PoolTimeout

from hordeops import dbwait, errors

# psycopg parses a statement's placeholders on every run unless it is under 4 KiB, when it
# caches the parsing. The pop's (`jobs.sql.claim`, about 9 KiB) is the hottest statement there
# is: parsed anew, it cost more CPU than the rest of an empty pop's Python (bench/idle_fleet.py).
# The cache holds a bounded number of statements (128), so a longer bound is safe.
STATEMENT_CACHE_BYTES = 32 * 1024
_queries.MAX_CACHED_STATEMENT_LENGTH = max(_queries.MAX_CACHED_STATEMENT_LENGTH, STATEMENT_CACHE_BYTES)


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
        """A pooled connection that is still open (`is_open`), by `deadline`.

        Checked here, not by the pool's own `check`: that one sleeps a second, then two, after
        each dead connection, so that the first request after a PostgreSQL restart, finding
        the pool's idle connections all closed, timed out. A dead one is closed and given back
        at once (the pool discards and replaces it) and the next one taken.
        """
        for _ in range(self.pool.max_size + 1):
            conn = self.pool.getconn(timeout=max(0.0, deadline - time.monotonic()))
            if is_open(conn):
                return conn
            conn.close()
            self.pool.putconn(conn)
        raise PoolTimeout("no pooled connection answered")


def is_open(conn) -> bool:
    """Whether an idle connection is still open, without a round trip: a poll of its socket.

    An idle connection has nothing to read: the server speaks only when asked. One that
    PostgreSQL ended while it sat in the pool (a restart, a terminated backend) has its last
    message or the end of the stream waiting, so its socket is readable. A round trip (the
    pool's `check_connection`) told the same at the cost of a query on every request: a
    fifth of an empty pop's time in the web process (bench/idle_fleet.py, py-spy).
    """
    if conn.closed:
        return False
    poller = select.poll()  # not select.select: a process with thousands of streams has fds past 1024
    try:
        poller.register(conn.fileno(), select.POLLIN)
        return not poller.poll(0)
    except (OSError, ValueError):
        return False
