"""`hordeops.asyncdb`: an async view's database steps, on shared threads, holding nothing between."""

import asyncio
import threading

import pytest
from asgiref.sync import async_to_sync
from django.conf import settings
from django.db import connection

from hordeops import asyncdb

WAIT_SECONDS = 10


def _query_and_report() -> bool:
    """Whether this step found its thread without a connection; then it uses one."""
    found_none = connection.connection is None
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    return found_none


@pytest.mark.django_db(transaction=True)
def test_each_step_gives_its_connection_back_before_the_next_one_starts():
    async def steps() -> list[bool]:
        return [await asyncdb.run(_query_and_report) for _ in range(3 * settings.WEB_ASYNC_DB_THREADS)]

    assert all(asyncio.run(steps()))


@pytest.mark.django_db(transaction=True)
def test_steps_run_on_the_shared_threads_not_on_the_event_loops():
    async def where() -> set[str]:
        steps = [asyncdb.run(lambda: threading.current_thread().name) for _ in range(20)]
        return set(await asyncio.gather(*steps))

    names = asyncio.run(where())
    assert names and all(name.startswith("hordeops-asyncdb") for name in names), names
    assert len(names) <= settings.WEB_ASYNC_DB_THREADS


def _busy_threads(release: threading.Event) -> list:
    """Occupy every shared thread until `release` is set."""
    started = threading.Barrier(settings.WEB_ASYNC_DB_THREADS + 1)

    def hold() -> None:
        started.wait(WAIT_SECONDS)
        release.wait(WAIT_SECONDS)

    holds = [asyncdb._threads().submit(hold) for _ in range(settings.WEB_ASYNC_DB_THREADS)]
    started.wait(WAIT_SECONDS)
    return holds


def test_a_step_cancelled_before_a_thread_takes_it_never_runs():
    ran = threading.Event()
    release = threading.Event()

    async def cancel_queued() -> None:
        holds = _busy_threads(release)
        step = asyncio.ensure_future(asyncdb.run(ran.set, undo=lambda _: ran.set()))
        await asyncio.sleep(0.05)
        step.cancel()
        with pytest.raises(asyncio.CancelledError):
            await step
        release.set()
        for hold in holds:
            await asyncio.wrap_future(hold)
        await asyncdb.run(lambda: None)  # a later step runs, and the cancelled one did not

    asyncio.run(cancel_queued())
    assert not ran.is_set()


def test_a_step_cancelled_while_it_runs_is_waited_for_and_undone():
    running = threading.Event()
    release = threading.Event()
    undone: list[str] = []

    def step() -> str:
        running.set()
        release.wait(WAIT_SECONDS)
        return "queued-request"

    async def cancel_running() -> None:
        task = asyncio.ensure_future(asyncdb.run(step, undo=undone.append))
        await asyncio.to_thread(running.wait, WAIT_SECONDS)
        task.cancel()
        await asyncio.sleep(0.05)
        assert not task.done()  # still waiting for the step to return
        release.set()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(cancel_running())
    assert undone == ["queued-request"]


def test_a_step_driven_from_sync_code_runs_on_the_callers_thread():
    async def where() -> int:
        return await asyncdb.run(threading.get_ident)

    assert async_to_sync(where)() == threading.get_ident()
