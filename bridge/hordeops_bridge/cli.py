"""`hordeops-bridge`: parse the settings, run the bridge until it is stopped.

Exit status: 0 when stopped (with `--once`: when the one job was submitted), 1 when the one
job of `--once` ended otherwise, 2 on a configuration error or an answer no retry can fix.
"""

import asyncio
import logging
import sys

from hordeops_bridge.config import ConfigError, load
from hordeops_bridge.horde import Fatal
from hordeops_bridge.worker import Bridge

log = logging.getLogger("hordeops_bridge")


async def _run(bridge: Bridge) -> int:
    bridge.install_signals()
    try:
        return await bridge.run()
    finally:
        await bridge.aclose()


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # httpx logs every call's URL at INFO: one line per progress post.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    try:
        config = load(argv)
    except ConfigError as exc:
        log.error("%s", exc)
        return 2
    try:
        return asyncio.run(_run(Bridge(config)))
    except Fatal as exc:
        log.error("%s", exc)
        return 2


if __name__ == "__main__":
    sys.exit(main())
