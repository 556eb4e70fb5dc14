"""The AI Horde's kudos rates for text, so that a kudo means the same on both hordes: what a
generation earns its worker's owner and what a request costs its requester.

Both scale with the model's size (billions of parameters, from the model table; a model not in
it counts as the AI Horde counts an unknown one) and with the context, whose VRAM grows faster
than linearly: 1,024 tokens is the base.
"""

import math
import re
from decimal import Decimal

from django.conf import settings

# What every request pays on top of its cost (the AI Horde's horde tax).
HORDE_TAX = 1
# What a request under another account's style pays on top of the tax, minted for the style's
# author (the AI Horde's `kudos_adjustment` and `record_style`: its `styled` kudos).
STYLE_FEE = 2
# The least a spendable balance may be (`get_min_kudos`): a debit past it is forgiven, and a
# balance below it is raised to it by its next movement.
ANONYMOUS_FLOOR = Decimal(-50)
# An account signed up with no identity behind it (`Account.pseudonymous`).
PSEUDONYMOUS_FLOOR = Decimal(14)
ACCOUNT_FLOOR = Decimal(25)
# What a worker earns for staying online, every UPTIME_SECONDS.
UPTIME_SECONDS = 600
BASE_CONTEXT = 1024
# What a bridge not in VALIDATED_BRIDGE_AGENTS earns of what a validated one would (the AI Horde's).
UNVALIDATED_SHARE = 0.3
# A request naming no model is reckoned as a 13B one; an unknown model as a 2.7B one.
ANY_MODEL_BILLIONS = 13
UNKNOWN_MODEL_BILLIONS = 2.7
# A model name's quantisation suffix (`-Q4_K_M`, `.Q8_0`, `-Q-Int4`): the reference lists the
# model without it.
QUANTISATION = re.compile(r"[.,-][a-zA-Z0-9]+?-?Q(-[Ii]nt)?[2-9]{1,2}([_.-][0-9a-zA-Z]+)*")


def floor(*, anonymous: bool, pseudonymous: bool = False) -> Decimal:
    """The least an account's spendable balance may be."""
    if anonymous:
        return ANONYMOUS_FLOOR
    return PSEUDONYMOUS_FLOOR if pseudonymous else ACCOUNT_FLOOR


def kudos(amount: float) -> Decimal:
    """An amount as the ledger holds it: to the hundredth."""
    return Decimal(str(round(amount, 2))).quantize(Decimal("0.01"))


def escrowed(amount: Decimal, *, uptime: bool) -> Decimal:
    """The part of an untrusted account's earnings held in escrow: half of a generation's, all
    of its uptime."""
    return amount if uptime else kudos(float(amount) / 2)


def context_multiplier(context_tokens: int) -> float:
    """1.2 + 2.2 ^ log2(context / 1,024), held within 0.1 and 30."""
    if context_tokens <= 0:
        return 0.1
    return min(30.0, max(0.1, 1.2 + 2.2 ** math.log2(context_tokens / BASE_CONTEXT)))


def reference_names(model: str) -> tuple[str, ...]:
    """The names to look a served model up by in the model table: as named (less a `::user`
    suffix), then without its quantisation suffix."""
    name = model.split("::")[0] if model.count("::") == 1 else model
    plain = QUANTISATION.sub("", name)
    return (name,) if plain == name else (name, plain)


def is_validated(bridge_agent: str) -> bool:
    """Whether a worker's bridge (`name:version:url`) is one whose output earns in full: its name
    is in VALIDATED_BRIDGE_AGENTS (`jobs.eligibility.validated_sql` is the same test in SQL)."""
    parts = bridge_agent.split(":", 2)
    return len(parts) == 3 and parts[0] in settings.VALIDATED_BRIDGE_AGENTS


def _size_bonus(billions: float) -> float:
    return (max(billions, 13) / 13) ** 0.20


def generation_kudos(
    *, tokens: int, prompt_tokens: int, billions: float | None, trusted: bool, validated: bool
) -> float:
    """What an accepted generation of `tokens` earns (`get_gen_kudos`). `prompt_tokens` is the
    AI Horde's count of the prompt (four characters a token, at least 20, at most the tokens
    asked for), which sets the context multiplier. An unknown model (`billions` None) earns its
    untrusted worker the multiplier alone, and a trusted one the rate of a 2.7B model."""
    multiplier = context_multiplier(prompt_tokens)
    if billions is None:
        if not trusted:
            return round(multiplier, 2)
        return round(tokens * multiplier * UNKNOWN_MODEL_BILLIONS / 100, 2)
    kudos = tokens * _size_bonus(billions) * billions / 125
    if not validated:
        kudos *= UNVALIDATED_SHARE
    return round(kudos * multiplier, 2)


def request_cost(
    *, max_length: int, max_context_length: int, billions: float | None, names_model: bool
) -> float:
    """What a request of `max_length` tokens costs before the horde tax (`calculate_kudos`): by
    its first model's size, a 13B model's when it names none, a 2.7B model's for an unknown one."""
    multiplier = context_multiplier(max_context_length)
    if not names_model:
        return round(max_length * ANY_MODEL_BILLIONS * multiplier / 100, 2)
    if billions is None:
        return round(max_length * UNKNOWN_MODEL_BILLIONS / 100 * multiplier, 2)
    return round(max_length * _size_bonus(billions) * billions * multiplier / 100, 2)


def uptime_reward(*, max_context_length: int, billions: float | None, validated: bool) -> float:
    """What a worker earns for UPTIME_SECONDS online (`calculate_uptime_reward`): by the context it
    loads and its first model's size against a 7B one; half the base for an unknown model."""
    base = 25 + 15 * min(max_context_length, 262_144) / 1024
    if billions is None:
        return round(base * 0.5, 2)
    if not validated:
        base *= UNVALIDATED_SHARE
    return round(base * max(billions / 7, 0.25), 2)
