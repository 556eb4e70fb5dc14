"""Django's PostgreSQL backend, with the pool's wait for a connection bounded per request."""

from django.db.backends.postgresql import base
from psycopg import IsolationLevel
from psycopg_pool import PoolTimeout

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
            return self.pool.getconn(timeout=wait.seconds)
        except PoolTimeout:
            if wait.by_deadline:
                raise errors.GenerationDeadlineExceeded() from None
            raise
