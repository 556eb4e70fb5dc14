"""The JSON parser of every route: UTF-8 only, no NUL bytes, no NaN or Infinity."""

import json
from typing import Any

from rest_framework.parsers import BaseParser

from hordeops import errors


def _refuse_constant(name: str) -> None:
    raise ValueError(f"{name} is not valid JSON")


def _reject_nul(value: Any) -> None:
    if isinstance(value, str):
        if "\x00" in value:
            raise errors.NulByteInPayload()
    elif isinstance(value, dict):
        for key, item in value.items():
            _reject_nul(key)
            _reject_nul(item)
    elif isinstance(value, list):
        for item in value:
            _reject_nul(item)


class StrictJSONParser(BaseParser):
    """Parse UTF-8 JSON, refusing NUL bytes anywhere (raw or escaped)."""

    media_type = "application/json"

    def parse(self, stream, media_type=None, parser_context=None) -> Any:
        raw = stream.read() if stream is not None else b""
        if b"\x00" in raw:
            raise errors.NulByteInPayload()
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise errors.InvalidJSON("The body is not valid UTF-8.") from None
        try:
            data = json.loads(text, parse_constant=_refuse_constant) if text.strip() else {}
        except (ValueError, RecursionError):
            raise errors.InvalidJSON() from None
        _reject_nul(data)
        return data
