"""Every hordeops metric, with its labels created up front so none starts missing."""

from prometheus_client import Counter

TRUST_LABELS = ("trusted", "untrusted")

lease_renewals = Counter(
    "horde_text_lease_renewals",
    "Progress posts that moved a text job's lease end (granted) or were held at its cap.",
    ["outcome", "trust"],
)
stale_aborts = Counter(
    "horde_text_stale_aborts",
    "Text generations aborted by the stale pass because their lease lapsed.",
    ["trust"],
)
pop_lease_capacity_limited = Counter(
    "horde_pop_lease_capacity_limited",
    "Pops by a chat worker whose capacity is below the max_length it declares.",
)

for _trust in TRUST_LABELS:
    stale_aborts.labels(trust=_trust)
    for _outcome in ("granted", "at_cap"):
        lease_renewals.labels(outcome=_outcome, trust=_trust)


def trust_label(trusted: bool) -> str:
    return "trusted" if trusted else "untrusted"
