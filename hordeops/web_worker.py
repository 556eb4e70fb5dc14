"""The gunicorn worker class `bin/web` runs: uvicorn's, stopping quietly."""

import os
import signal
from types import FrameType

from uvicorn.workers import UvicornWorker

STOPS = (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT)


def _exit(signum: int, frame: FrameType | None) -> None:
    # On its way out, a worker ignores further stops: Python puts back the default (death by the
    # signal) for every signal it handles as it exits, and the master's SIGQUIT after Ctrl-C came then.
    for stop in STOPS:
        signal.signal(stop, signal.SIG_IGN)
    raise SystemExit(0)


def _quit(signum: int, frame: FrameType | None) -> None:
    # The quick stop leaves at once. TERM and INT reach _exit only when uvicorn re-raises them
    # after its shutdown; QUIT comes at any moment, and a SystemExit raised inside a uvloop
    # transport's callback or a request is logged there and swallowed: the worker ran on, every
    # stop ignored, until the master's SIGKILL.
    os._exit(0)


class QuietUvicornWorker(UvicornWorker):
    """uvicorn's worker, exiting 0 on a normal stop.

    uvicorn handles SIGTERM (gunicorn stopping its workers) and SIGINT (Ctrl-C) by finishing
    its requests and shutting down, then raises the signal again against the handler it found,
    which uvicorn's worker had reset to the default: the process is killed by it, and gunicorn
    logs `Worker (pid:...) was sent SIGTERM!` at ERROR for every worker of a normal stop. With
    this handler found instead, the second raise is an exit with status 0.

    SIGQUIT is gunicorn's quick stop, which the master also sends its workers on Ctrl-C: uvicorn
    sets it on its event loop to a handler that stops nothing, and the loop puts back the default
    (a core dump) when it closes, so a worker still finishing Ctrl-C's SIGINT was killed by it.
    Here it exits 0 at once (`os._exit`, which no code it interrupts can catch), and once a worker
    is exiting it ignores every stop signal.
    """

    def init_signals(self) -> None:
        super().init_signals()
        for stop in STOPS:
            signal.signal(stop, _quit if stop == signal.SIGQUIT else _exit)

    def _install_sigquit_handler(self) -> None:
        pass  # SIGQUIT keeps init_signals' handler, set outside the loop so it outlives it
