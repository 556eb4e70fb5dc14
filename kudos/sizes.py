"""The model table as each process reads it: a snapshot of every model's size, read whole and
kept for REFRESH_SECONDS, so that reckoning a submit's kudos costs no statement. A change made
in this process (the admin, `import_text_models`) is seen at once; one made in another
process within REFRESH_SECONDS."""

import time

from kudos.rates import reference_names

REFRESH_SECONDS = 30

_snapshot: tuple[float, dict[str, int]] | None = None


def _table() -> dict[str, int]:
    global _snapshot
    if _snapshot is None or time.monotonic() - _snapshot[0] > REFRESH_SECONDS:
        from kudos.models import TextModel

        _snapshot = (time.monotonic(), dict(TextModel.objects.values_list("name", "parameters")))
    return _snapshot[1]


def billions(model: str) -> float | None:
    """The size of a served model, in billions of parameters, found as the AI Horde finds it
    (`kudos.rates.reference_names`); None for a model the table does not know."""
    table = _table()
    for name in reference_names(model):
        if name in table:
            return table[name] / 1_000_000_000
    return None


def forget(**kwargs) -> None:
    """Drop the snapshot: the next reckoning reads the table again."""
    global _snapshot
    _snapshot = None
