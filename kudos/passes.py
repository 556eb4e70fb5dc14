"""The kudos pass (Celery beat, every KUDOS_PASS_SECONDS): uptime paid, escrow released."""

from datetime import datetime
from typing import NamedTuple

from hordeops import clock
from kudos.trust import release_escrow
from kudos.uptime import pay_uptime


class KudosPass(NamedTuple):
    uptime_periods: int
    released: list[int]  # accounts whose escrow was released


def run_kudos_pass(*, now: datetime | None = None) -> KudosPass:
    now = now or clock.now()
    return KudosPass(uptime_periods=pay_uptime(now=now), released=release_escrow(now=now))
