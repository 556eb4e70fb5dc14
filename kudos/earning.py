"""What a generation earns its worker's owner, and costs its requester, as one ledger event.

A generation settles once, keyed by its id, whether by its worker's submit or by its request's
cancellation after output: the worker's owner is paid what `kudos.rates.generation_kudos` says
for the tokens it delivered, minted by the treasury (half of it to escrow while the owner is
untrusted); the requester pays the same, burned into the sink, unless the result was censored
or the horde failed to deliver it (`charged`).
The event also adds to both accounts' records (`Event.records`): the tokens paid for and one job.
"""

from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any
from uuid import UUID

from kudos import rates, sizes
from kudos.ledger import ZERO, event_params, to_account, to_system
from kudos.models import Event, Wallet

# A generation's text was withheld from its requester: it costs them nothing.
CENSORED = "censored"


@dataclass(frozen=True)
class Earner:
    """The account a generation's worker belongs to, and the worker's bridge."""

    account_id: int
    trusted: bool
    anonymous: bool
    bridge_agent: str


@dataclass(frozen=True)
class Settlement:
    earned: Decimal  # paid to the worker's owner
    cost: Decimal  # charged to the requester
    params: dict[str, Any]  # the event's, for `kudos.sql.post_event`


def things(count: int, *, max_length: int) -> int:
    """The AI Horde's count of a text's tokens: at least 20, at most the tokens asked for."""
    return min(max_length, max(20, count))


def generation_key(generation_id: UUID) -> str:
    return f"generation:{generation_id}"


def settle_generation(
    *,
    generation_id: UUID,
    model: str,
    tokens: int,
    prompt_tokens: int,
    max_length: int,
    earner: Earner,
    payer_id: int,
    result: str,
    now: datetime,
    charged: bool = True,
) -> Settlement:
    """The event that settles a generation of `tokens` delivered tokens of `model`. Not
    `charged`: the horde failed to deliver them to the requester, who pays nothing and is not
    counted as using them; the worker's owner is paid all the same."""
    earned = rates.kudos(
        rates.generation_kudos(
            tokens=things(tokens, max_length=max_length),
            prompt_tokens=things(prompt_tokens, max_length=max_length),
            billions=sizes.billions(model),
            trusted=earner.trusted,
            validated=rates.is_validated(earner.bridge_agent),
        )
    )
    held = ZERO if earner.trusted or earner.anonymous else rates.escrowed(earned, uptime=False)
    cost = ZERO if result == CENSORED or not charged else earned
    entries = [
        to_system(Wallet.System.TREASURY, -earned),
        to_account(earner.account_id, earned - held),
        to_account(earner.account_id, held, escrow=True),
        to_account(payer_id, -cost),
        to_system(Wallet.System.SINK, cost),
    ]
    paid_tokens = things(tokens, max_length=max_length)
    records = {payer_id: {"usage_tokens": paid_tokens, "request_text": 1}} if charged else {}
    earner_records = records.setdefault(earner.account_id, {})
    earner_records.update(contribution_tokens=paid_tokens, fulfillment_text=1)
    params = event_params(
        kind=Event.Kind.GENERATION,
        key=generation_key(generation_id),
        entries=entries,
        now=now,
        records=records,
    )
    return Settlement(earned=earned, cost=cost, params=params)
