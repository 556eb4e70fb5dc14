"""The tables and the state values the statements of `jobs.sql` are built from."""

from jobs.models import Generation, QueuedModel, TextRequest
from workers.models import Account, Worker

REQUESTS, GENERATIONS = TextRequest._meta.db_table, Generation._meta.db_table
QUEUED_MODELS = QueuedModel._meta.db_table
WORKERS, ACCOUNTS = Worker._meta.db_table, Account._meta.db_table

# Request states and generation states, as the statements write them.
ACTIVE, REQUEST_DONE = TextRequest.State.ACTIVE.value, TextRequest.State.DONE.value
TEXT = TextRequest.Kind.TEXT.value
EXPIRED, FAULTED = TextRequest.State.EXPIRED.value, TextRequest.State.FAULTED.value
PROCESSING, DONE = Generation.State.PROCESSING.value, Generation.State.DONE.value
ABORTED, CANCELLED = Generation.State.ABORTED.value, Generation.State.CANCELLED.value


def folded(sql: str) -> str:
    """The statement on one line (it holds no comments, and no literal with spaces in it)."""
    assert "--" not in sql
    return " ".join(sql.split())
