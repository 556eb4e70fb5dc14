"""The JSON parser of every route: UTF-8 only, no NUL bytes, no NaN or Infinity."""

import json
import math
from typing import Any

from rest_framework.parsers import BaseParser

from hordeops import errors

# No horde payload nests deeper than a few levels; refusing deep bodies here keeps later
# recursive code (DRF, the JSON encoder that writes JSONB columns) from hitting the
# recursion limit, which would be a 500.
MAX_JSON_DEPTH = 64


def _refuse_constant(name: str) -> None:
    raise ValueError(f"{name} is not valid JSON")


def _finite_float(text: str) -> float:
    # `1e309` parses to inf, which PostgreSQL's JSONB (and JSON itself) cannot hold.
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text} is out of range")
    return value


def _check_string(value: str) -> None:
    if "\x00" in value:
        raise errors.NulByteInPayload()
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        # An escaped lone surrogate such as "\ud800": valid JSON syntax, not valid Unicode.
        message = "The body holds an unpaired surrogate, which is not valid Unicode."
        raise errors.InvalidJSON(message) from None


def _check(data: Any) -> None:
    """Refuse NUL bytes, lone surrogates and deep nesting, without recursing."""
    pending = [(data, 1)]
    while pending:
        value, depth = pending.pop()
        if isinstance(value, str):
            _check_string(value)
        elif isinstance(value, (dict, list)):
            if depth > MAX_JSON_DEPTH:
                raise errors.InvalidJSON(f"The body nests deeper than {MAX_JSON_DEPTH} levels.")
            if isinstance(value, dict):
                for key, item in value.items():
                    _check_string(key)
                    pending.append((item, depth + 1))
            else:
                pending.extend((item, depth + 1) for item in value)


def loads_strict(raw: bytes) -> Any:
    """Parse a request body as UTF-8 JSON, refusing NUL bytes anywhere (raw or escaped)."""
    if b"\x00" in raw:
        raise errors.NulByteInPayload()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise errors.InvalidJSON("The body is not valid UTF-8.") from None
    try:
        data = (
            json.loads(text, parse_constant=_refuse_constant, parse_float=_finite_float)
            if text.strip()
            else {}
        )
    except RecursionError:
        raise errors.InvalidJSON(f"The body nests deeper than {MAX_JSON_DEPTH} levels.") from None
    except ValueError:
        raise errors.InvalidJSON() from None
    _check(data)
    return data


class StrictJSONParser(BaseParser):
    """DRF's parser for every horde route: `loads_strict`."""

    media_type = "application/json"

    def parse(self, stream, media_type=None, parser_context=None) -> Any:
        return loads_strict(stream.read() if stream is not None else b"")
