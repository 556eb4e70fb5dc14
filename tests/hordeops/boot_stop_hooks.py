"""A gunicorn config (`GUNICORN_CMD_ARGS=--config <this file>`) whose workers stop bin/web while
they boot, at the moment BOOT_STOP_AT names, with the stop BOOT_STOP names.

- `fork`: just after a worker is forked, before it has set its own signal handlers; it waits
  there a second, so that the master's stop reaches it in that window.
- `finalizer`: once its app is loaded, from inside a finalizer, where it then waits for the
  stop to land, as a stop lands in importlib's module-lock callbacks while the app is imported.
"""

import os
import signal
import time

STOP_AT = os.environ["BOOT_STOP_AT"]
STOP = os.environ["BOOT_STOP"]


def _stop() -> None:
    if STOP == "sigterm":  # as bin/stack stops it
        os.kill(os.getppid(), signal.SIGTERM)
    elif STOP == "ctrl-c":  # every process of the group
        os.killpg(0, signal.SIGINT)
    else:  # gunicorn's quick stop
        os.kill(os.getppid(), signal.SIGQUIT)


class _StopsInFinalizer:
    def __del__(self) -> None:
        _stop()
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            time.sleep(0.05)  # the stop's handler runs here, inside the finalizer


def post_fork(server, worker) -> None:
    if STOP_AT == "fork":
        _stop()
        time.sleep(1)


def post_worker_init(worker) -> None:
    if STOP_AT == "finalizer":
        _StopsInFinalizer()  # dropped at once: its __del__ runs now
