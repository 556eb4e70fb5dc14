"""The horde's worker routes (pop, progress, submit, goodbye), with the retries they allow.

Resending is safe on every one of them: a pop whose answer was lost leaves a job that lapses
and is restarted, a progress post resent under the same `seq` is recognised and not relayed
twice, a resent submit answers `DuplicateGen`, and a goodbye said twice is said once.
"""

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any

import httpx

log = logging.getLogger("hordeops_bridge.horde")

# Seconds before each retry of one call (network errors and 502/503/504): about a minute in all.
RETRY_DELAYS = (0.5, 1, 2, 4, 8, 8, 8, 8, 8, 8)
RETRIED_STATUSES = frozenset({502, 503, 504})
# The goodbye is sent while the bridge stops, which a service manager waits for: a few seconds
# of retries, not a minute; unsaid, the horde counts the worker online for its usual window.
GOODBYE_RETRY_DELAYS = (0.5, 1, 2)
# Seconds to connect, and to wait for an answer (a waiting pop's wait on top).
CONNECT_SECONDS = 10.0
READ_SECONDS = 30.0


class HordeUnreachable(Exception):
    """Every attempt of one call failed on the network or with a 502/503/504."""


class Fatal(Exception):
    """An answer no retry will change: a bad key, a worker name owned by another account."""


@dataclass(frozen=True)
class Answer:
    status: int
    body: dict[str, Any] = field(default_factory=dict)

    @property
    def rc(self) -> str:
        return str(self.body.get("rc", ""))

    @property
    def message(self) -> str:
        return str(self.body.get("message", ""))


class Horde:
    def __init__(
        self,
        url: str,
        api_key: str,
        *,
        agent: str,
        connections: int = 4,
        retry_delays: tuple[float, ...] = RETRY_DELAYS,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.retry_delays = retry_delays
        self.http = httpx.AsyncClient(
            base_url=url.rstrip("/") + "/api/v2/",
            headers={"apikey": api_key, "Client-Agent": agent},
            timeout=httpx.Timeout(READ_SECONDS, connect=CONNECT_SECONDS),
            limits=httpx.Limits(max_connections=connections, max_keepalive_connections=connections),
            transport=transport,
        )

    async def aclose(self) -> None:
        await self.http.aclose()

    async def post(
        self,
        path: str,
        body: dict[str, Any],
        *,
        retry_delays: tuple[float, ...] | None = None,
        timeout: httpx.Timeout | None = None,
    ) -> Answer:
        """POST `body`; on a network error or a 502/503/504, wait and send the same body again."""
        delays = self.retry_delays if retry_delays is None else retry_delays
        extra = {} if timeout is None else {"timeout": timeout}
        for attempt, delay in enumerate((*delays, None), start=1):
            try:
                response = await self.http.post(path, json=body, **extra)
            except httpx.TransportError as exc:
                problem = type(exc).__name__
            else:
                if response.status_code not in RETRIED_STATUSES:
                    try:
                        answer = response.json()
                    except ValueError:
                        answer = {}
                    return Answer(response.status_code, answer if isinstance(answer, dict) else {})
                problem = f"HTTP {response.status_code}"
            if delay is None:
                raise HordeUnreachable(f"{path}: {problem} after {attempt} attempts")
            log.warning("%s: %s, retrying in %ss (attempt %d)", path, problem, delay, attempt)
            await asyncio.sleep(delay)
        raise AssertionError("unreachable")

    async def pop(self, body: dict[str, Any]) -> Answer:
        # A waiting pop answers after up to `wait_seconds`: the read waits that much longer.
        wait = body.get("wait_seconds", 0)
        timeout = httpx.Timeout(READ_SECONDS + wait, connect=CONNECT_SECONDS) if wait else None
        answer = await self.post("generate/text/pop", body, timeout=timeout)
        if answer.status in (401, 403) and answer.rc != "WorkerMaintenance":
            raise Fatal(f"pop answered {answer.status} {answer.rc}: {answer.message}")
        return answer

    async def progress(self, body: dict[str, Any]) -> Answer:
        return await self.post("generate/text/progress", body)

    async def submit(
        self,
        job_id: str,
        text: str,
        *,
        state: str = "ok",
        seed: int = 0,
        tool_calls: list[dict[str, Any]] | None = None,
    ) -> Answer:
        body: dict[str, Any] = {"id": job_id, "generation": text, "state": state, "seed": seed}
        if tool_calls:  # hordeops's own field: a reply without calls is the AI Horde's submit
            body["tool_calls"] = tool_calls
        return await self.post("generate/text/submit", body)

    async def goodbye(self, name: str) -> Answer:
        """Tell the horde the worker `name` stops: it is offline at once, until its next pop."""
        return await self.post("workers/goodbye", {"name": name}, retry_delays=GOODBYE_RETRY_DELAYS)
