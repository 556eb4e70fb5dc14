"""The bridge's pops wait at the horde for a job (`--pop_wait`, `wait_seconds`): in-process,
against a horde faked by an httpx transport."""

import asyncio
import json
import time

import httpx
import pytest

from hordeops_bridge.config import ConfigError, load
from hordeops_bridge.horde import Horde
from hordeops_bridge.worker import Bridge

EMPTY_POP = {"id": None, "ids": [], "payload": {}, "skipped": {}, "messages": []}


class FakeHorde(httpx.AsyncBaseTransport):
    """Answers every pop empty after `delay` seconds, and keeps what each pop sent."""

    def __init__(self, delay: float = 0.0) -> None:
        self.delay = delay
        self.pops: list[tuple[dict, dict]] = []  # (body, timeouts)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.pops.append((json.loads(request.content), request.extensions["timeout"]))
        await asyncio.sleep(self.delay)
        return httpx.Response(200, json=EMPTY_POP)


def bridge(fake: FakeHorde, *args: str, environ: dict[str, str] | None = None) -> Bridge:
    config = load(["-a", "key", "-n", "waiter", *args], environ=environ or {})
    horde = Horde(config.horde_url, config.api_key, agent="test", transport=fake)
    made = Bridge(config, horde=horde, backend=object())
    made.model, made.max_length, made.max_context_length = "m", 512, 2048
    return made


def test_by_default_the_bridge_pops_with_a_20_second_wait_and_reads_the_answer_longer() -> None:
    fake = FakeHorde()
    asyncio.run(bridge(fake).horde.pop(bridge(fake).pop_body()))
    body, timeouts = fake.pops[0]
    assert body["wait_seconds"] == 20
    assert timeouts["read"] > 20 + 10


def test_a_pop_wait_of_0_sends_the_ai_hordes_own_pop() -> None:
    fake = FakeHorde()
    plain = bridge(fake, environ={"HORDE_POP_WAIT": "0"})
    asyncio.run(plain.horde.pop(plain.pop_body()))
    body, timeouts = fake.pops[0]
    assert "wait_seconds" not in body
    assert timeouts["read"] == 30


@pytest.mark.parametrize("wait", ["31", "-1"])
def test_a_pop_wait_the_horde_would_refuse_is_a_configuration_error(wait) -> None:
    with pytest.raises(ConfigError, match="--pop_wait"):
        load(["-a", "key", "-n", "w", f"--pop_wait={wait}"], environ={})


def test_a_bridge_that_stops_while_its_pop_waits_stops_at_once() -> None:
    fake = FakeHorde(delay=20)
    waiting = bridge(fake)

    async def scenario() -> float:
        slot = asyncio.create_task(waiting._slot())
        await asyncio.sleep(0.2)
        stopped = time.monotonic()
        waiting.stop()
        await asyncio.wait_for(slot, 5)
        await waiting.horde.aclose()
        return time.monotonic() - stopped

    assert asyncio.run(scenario()) < 1
    assert len(fake.pops) == 1


def test_after_a_pop_that_did_not_wait_the_bridge_keeps_its_pop_interval() -> None:
    fake = FakeHorde()  # answers at once: a horde that does not wait
    polling = bridge(fake, "--pop_interval", "0.3")

    async def scenario() -> None:
        slot = asyncio.create_task(polling._slot())
        await asyncio.sleep(1.0)
        polling.stop()
        await asyncio.wait_for(slot, 5)
        await polling.horde.aclose()

    asyncio.run(scenario())
    assert 3 <= len(fake.pops) <= 5
