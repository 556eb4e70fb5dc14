"""Admission: the horde-wide rules a request meets before it is queued, whatever route it came
by (the horde's async route, the four `/v1` protocols, and any route that queues next).

`admit` is the first step of each queueing service (`jobs.services.requests`), before any check
of the request itself, as the AI Horde refuses maintenance before it reads a model or a worker:
maintenance mode, then the account's suspension, then the client address's timeout. The last
two rules, the account's bound of active requests and the kudos it must hold upfront, are
applied by the queueing statement itself (`jobs.sql.queue_request`), under the account's lock,
for only there can they be counted without a race.
"""

from datetime import datetime

from hordeops import errors, timeouts
from workers import modes
from workers.models import Account
from workers.services import refuse_suspended


def admit(*, account: Account, address: str, now: datetime) -> None:
    """Refuse a request the horde takes from no one now (MaintenanceMode), from this account
    (AccountSuspended) or from this address (TimeoutIP). The account is the one authentication
    loaded, and the modes and timeouts are per-process snapshots: this runs no statement.
    `address` is the client's (`hordeops.ratelimit.request_address`), "" when there is none."""
    if modes.current().maintenance:
        raise errors.MaintenanceMode()
    refuse_suspended(account)
    refused = timeouts.refusal(address, now=now.timestamp())
    if refused is not None:
        raise refused
