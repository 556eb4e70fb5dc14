"""Numbers read from a path, a query string, a header or the environment: ASCII, and bounded.

`str.isdigit()` is true of '²' and '①', which `int()` then refuses, and `int()` refuses more
than 4,300 digits: each was a 500 (with its traceback in the log) on a route anyone may call.
Only ASCII digits, and only as many as the largest value can have, reach `int()` here.
"""

# More digits than any value this project reads: a PostgreSQL bigint has 19.
MAX_DIGITS = 18


def ascii_int(raw: str | None, *, max_digits: int = MAX_DIGITS) -> int | None:
    """A plain ASCII decimal integer of at most `max_digits` digits (no sign, no spaces), or None."""
    if raw and len(raw) <= max_digits and raw.isascii() and raw.isdigit():
        return int(raw)
    return None
