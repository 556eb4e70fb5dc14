"""The gunicorn worker class `bin/web` runs: uvicorn's, stopping quietly, its garbage collector settled."""

import gc
import os
import signal
import socket
import sys
from types import FrameType

from django.conf import settings
from gunicorn.arbiter import Arbiter
from uvicorn.server import Server
from uvicorn.workers import UvicornWorker

from hordeops.stopping import run_stop_hooks
from hordeops.web_protocol import BoundedHeadProtocol

STOPS = (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT)

# Whether uvicorn's server holds TERM and INT (`StoppingServer._serve`); before, the worker boots.
_serving = False
# Set in the master from a worker's creation until gunicorn forks it (`_block_stops_for_worker`).
_worker_to_fork = False


def _exit(signum: int, frame: FrameType | None) -> None:
    if not _serving:
        # Booting, nothing served: nothing to finish. A SystemExit raised wherever the stop lands
        # was swallowed there (a finalizer, `__set_name__`, uvloop's setup): the worker then
        # served on, every stop ignored, until the master's SIGKILL 30 s later.
        os._exit(0)
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


def _block_stops_for_worker() -> None:
    # Between the fork and the worker's own handlers a stop would reach the master's handlers,
    # forked with it, and be lost: blocked, it waits for the worker's (`init_signals`).
    if _worker_to_fork:
        signal.pthread_sigmask(signal.SIG_BLOCK, STOPS)


def _unblock_stops_in_master() -> None:
    global _worker_to_fork
    if _worker_to_fork:
        _worker_to_fork = False
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOPS)


def _forked_worker() -> None:
    global _worker_to_fork
    _worker_to_fork = False  # its stops stay blocked until its handlers are set


os.register_at_fork(
    before=_block_stops_for_worker, after_in_parent=_unblock_stops_in_master, after_in_child=_forked_worker
)


def settle_gc() -> None:
    """Set the garbage collector for a web process that holds thousands of open streams.

    A pass over the oldest generation stops every thread of the process, and with thousands of
    streams open it is long and frequent enough to set the relay's p99. So:

    - what the app loaded is frozen out of every pass (`gc.freeze`: objects that live as long
      as the process), after a collection so that no garbage is kept;
    - the thresholds are WEB_GC_THRESHOLDS. Python's middle threshold (10) promotes what is in
      flight at each tenth young pass to the oldest generation, where it counts towards the next
      full pass even once it has died; 100 promotes a tenth as much.
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(*settings.WEB_GC_THRESHOLDS)


class StoppingServer(Server):
    """uvicorn's server, running the apps' stop hooks (`hordeops.stopping`) as its shutdown
    begins: the open chat streams are ended with their error event and their requests
    cancelled, instead of being held until gunicorn's graceful timeout kills them mid-reply."""

    async def _serve(self, sockets: list[socket.socket] | None = None) -> None:
        # Run inside uvicorn's `capture_signals`: a stop is now its graceful shutdown, after
        # which it raises the stop again, against `_exit`, as the worker's way out.
        global _serving
        _serving = True
        await super()._serve(sockets)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        await run_stop_hooks()
        await super().shutdown(sockets=sockets)


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

    A stop while the worker boots (before its server runs) exits 0 at once too: nothing is served
    yet. Until the worker has set its handlers, from gunicorn's fork on, the stops wait blocked.

    Once the app is loaded, the process's garbage collector is settled (`settle_gc`). Its server
    runs the apps' stop hooks first when it stops (`StoppingServer`).

    Its connections speak `hordeops.web_protocol.BoundedHeadProtocol`: uvicorn's httptools
    protocol with each request head bounded in size and time, and the connections a process
    holds bounded in number.
    """

    CONFIG_KWARGS = {"loop": "auto", "http": BoundedHeadProtocol}

    def __init__(self, *args, **kwargs) -> None:
        global _worker_to_fork
        super().__init__(*args, **kwargs)
        _worker_to_fork = True  # gunicorn makes it in the master and forks it next

    def init_signals(self) -> None:
        super().init_signals()
        for stop in STOPS:
            signal.signal(stop, _quit if stop == signal.SIGQUIT else _exit)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOPS)  # a stop that came since the fork lands now

    def load_wsgi(self) -> None:
        super().load_wsgi()  # the app, and with it Django and its settings
        settle_gc()

    def _install_sigquit_handler(self) -> None:
        pass  # SIGQUIT keeps init_signals' handler, set outside the loop so it outlives it

    async def _serve(self) -> None:
        # uvicorn's own, with the server that runs the stop hooks.
        self.config.app = self.wsgi
        server = StoppingServer(config=self.config)
        await server.serve(sockets=self.sockets)
        if not server.started:
            sys.exit(Arbiter.WORKER_BOOT_ERROR)
