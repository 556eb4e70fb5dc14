"""The model servers the bridge drives: OpenAI-compatible ones and the KoboldAI API.

Each backend streams a reply as `Delta`s. Leaving the stream (the job was cancelled, its lease
lapsed, its deadline passed) closes the HTTP response, which is how an OpenAI-compatible server
learns that nobody reads any more and stops generating; KoboldCpp is also told to abort.
"""

import httpx

from hordeops_bridge.backends.base import Backend, BackendError, BackendInfo, Delta
from hordeops_bridge.backends.kobold import KoboldBackend
from hordeops_bridge.backends.openai import OpenAIBackend

__all__ = ["Backend", "BackendError", "BackendInfo", "Delta", "KoboldBackend", "OpenAIBackend", "backend_for"]


def backend_for(
    kind: str,
    url: str,
    *,
    api_key: str = "",
    wanted: str = "",
    transport: httpx.AsyncBaseTransport | None = None,
) -> Backend:
    cls = {"openai": OpenAIBackend, "kobold": KoboldBackend}[kind]
    return cls(url, api_key=api_key, wanted=wanted, transport=transport)
