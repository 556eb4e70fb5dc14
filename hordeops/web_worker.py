"""The gunicorn worker class `bin/web` runs: uvicorn's, stopping quietly."""

import signal
from types import FrameType

from uvicorn.workers import UvicornWorker


def _exit(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(0)


class QuietUvicornWorker(UvicornWorker):
    """uvicorn's worker, exiting 0 on a normal stop.

    uvicorn handles SIGTERM (gunicorn stopping its workers) and SIGINT (Ctrl-C) by finishing
    its requests and shutting down, then raises the signal again against the handler it found,
    which uvicorn's worker had reset to the default: the process is killed by it, and gunicorn
    logs `Worker (pid:...) was sent SIGTERM!` at ERROR for every worker of a normal stop. With
    this handler found instead, the second raise is an exit with status 0.
    """

    def init_signals(self) -> None:
        super().init_signals()
        for stop in (signal.SIGTERM, signal.SIGINT):
            signal.signal(stop, _exit)
