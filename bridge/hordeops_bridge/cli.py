"""`hordeops-bridge`: parse the settings, run the bridge until it is stopped.

Exit status: 0 when stopped (with `--once`: when the one job was submitted), 1 when the one
job of `--once` ended otherwise, 2 on a configuration error or an answer no retry can fix.
"""

import asyncio
import logging
import sys
from collections.abc import Callable

from hordeops_bridge.backends import Backend
from hordeops_bridge.config import Config, ConfigError, load
from hordeops_bridge.horde import Fatal
from hordeops_bridge.worker import Bridge

log = logging.getLogger("hordeops_bridge")


async def _run(bridge: Bridge) -> int:
    bridge.install_signals()
    try:
        return await bridge.run()
    finally:
        await bridge.aclose()


def main(argv: list[str] | None = None, *, backend: Callable[[Config], Backend] | None = None) -> int:
    """Run the bridge; `backend` makes the backend from the settings instead of `--backend`
    (a program built on the bridge plugs its own in this way)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # httpx logs every call's URL at INFO: one line per progress post.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    try:
        config = load(argv)
    except ConfigError as exc:
        log.error("%s", exc)
        return 2
    try:
        return asyncio.run(_run(Bridge(config, backend=backend(config) if backend else None)))
    except Fatal as exc:
        log.error("%s", exc)
        return 2


if __name__ == "__main__":
    sys.exit(main())
