"""The bridge's main loop: `threads` slots, each popping and serving one job at a time.

Stopping: the first SIGTERM or SIGINT stops popping and lets running jobs finish for
`grace_seconds`, then gives back what still runs; a second SIGINT gives back at once. A job
given back goes to another worker straight away instead of waiting for its lease to lapse.
With no job left, the bridge says goodbye: the horde counts the worker offline at once, rather
than for WORKER_ONLINE_SECONDS after its last pop, and offers its requests to others.
"""

import asyncio
import contextlib
import logging
import signal
import time
from typing import Any

from hordeops_bridge.backends import Backend, BackendError, BackendInfo, backend_for
from hordeops_bridge.config import Config, lengths
from hordeops_bridge.horde import Fatal, Horde, HordeUnreachable
from hordeops_bridge.job import Job
from hordeops_bridge.serve import JobServer, Outcome, Served

log = logging.getLogger("hordeops_bridge")

# Seconds between checks of a backend that is down or failed a job.
BACKEND_CHECK_SECONDS = 5.0


class Bridge:
    def __init__(self, config: Config, *, horde: Horde | None = None, backend: Backend | None = None) -> None:
        self.config = config
        self.horde = horde or Horde(
            config.horde_url,
            config.api_key,
            agent=config.bridge_agent,
            connections=2 * config.threads + 2,
        )
        self.backend = backend or backend_for(
            config.backend, config.backend_url, api_key=config.backend_api_key, wanted=config.model
        )
        self.stopping = asyncio.Event()
        self.running: dict[str, asyncio.Task] = {}
        self.backend_down = asyncio.Event()
        self.seen_messages: set[str] = set()
        self.last_outcome: Outcome | None = None
        self.interrupts = 0

    # --- stopping ---------------------------------------------------------------------------

    def install_signals(self) -> None:
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, self.stop)
        loop.add_signal_handler(signal.SIGINT, self.interrupt)

    def interrupt(self) -> None:
        self.interrupts += 1
        if self.interrupts == 1:
            self.stop()
        else:
            log.warning("second interrupt: giving back %d running jobs now", len(self.running))
            self.give_back_all()

    def stop(self) -> None:
        if self.stopping.is_set():
            return
        self.stopping.set()
        if self.running:
            log.warning(
                "stopping: no more pops; %d running jobs may finish within %ss",
                len(self.running),
                self.config.grace_seconds,
            )
            asyncio.get_running_loop().call_later(self.config.grace_seconds, self.give_back_all)
        else:
            log.info("stopping: no job running")

    def give_back_all(self) -> None:
        for task in list(self.running.values()):
            task.cancel()

    async def _wait_or_stop(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.stopping.wait(), timeout=seconds)

    # --- the backend ------------------------------------------------------------------------

    async def describe_backend(self) -> BackendInfo | None:
        """What the backend serves; waits while it is down, None if stopped meanwhile."""
        said = False
        while not self.stopping.is_set():
            try:
                return await self.backend.describe()
            except BackendError as exc:
                if not said:
                    log.warning("backend %s not ready (%s); waiting for it", self.config.backend_url, exc)
                    said = True
            await self._wait_or_stop(BACKEND_CHECK_SECONDS)
        return None

    async def _wait_for_backend(self) -> None:
        log.warning("not popping until the backend answers again (checked every %ss)", BACKEND_CHECK_SECONDS)
        while not self.stopping.is_set() and not await self.backend.healthy():
            await self._wait_or_stop(BACKEND_CHECK_SECONDS)
        if not self.stopping.is_set():
            log.info("the backend answers again; popping")
        self.backend_down.clear()

    # --- the loop ---------------------------------------------------------------------------

    async def run(self) -> int:
        info = await self.describe_backend()
        if info is None:
            return 0
        config = self.config
        self.model = config.model or info.model
        declared = lengths(config, info.max_length, info.max_context_length)
        self.max_length, self.max_context_length = declared.max_length, declared.max_context_length
        self.server = JobServer(
            self.horde,
            self.backend,
            context_limit=self.max_context_length,
            every_tokens=config.progress_tokens,
            every_seconds=config.progress_seconds,
            verbose=config.verbose,
        )
        log.info(
            "serving %s as %s from %s (%s), %d threads, max_length %d (%s), max_context_length %d (%s)",
            self.model,
            config.worker_name,
            config.backend_url,
            config.backend,
            config.threads,
            self.max_length,
            declared.length_from,
            self.max_context_length,
            declared.context_from,
        )
        slots = [asyncio.create_task(self._slot()) for _ in range(config.threads)]
        try:
            await asyncio.gather(*slots)
        except Fatal:
            self.stopping.set()
            self.give_back_all()
            for slot in slots:
                slot.cancel()
            await asyncio.gather(*slots, return_exceptions=True)
            raise
        # Every slot has ended, so every job was submitted or given back: nothing is left that
        # the horde would wait for from this worker.
        await self.say_goodbye()
        if config.once:
            return 0 if self.last_outcome is Outcome.SUBMITTED else 1
        return 0

    async def say_goodbye(self) -> None:
        name = self.config.worker_name
        try:
            answer = await self.horde.goodbye(name)
        except HordeUnreachable as exc:
            log.warning("goodbye not delivered (%s): the horde counts %s online a while longer", exc, name)
            return
        if answer.status == 200:
            log.info("said goodbye: %s is offline until it pops again", name)
        else:
            log.warning("goodbye answered %s %s: %s", answer.status, answer.rc, answer.message)

    def pop_body(self) -> dict[str, Any]:
        return {
            "name": self.config.worker_name,
            "models": [self.model],
            "max_length": self.max_length,
            "max_context_length": self.max_context_length,
            "threads": self.config.threads,
            "amount": 1,
            "chat": True,
            "bridge_agent": self.config.bridge_agent,
            # Sent only when declared: a pop without them is the AI Horde's own.
            **{name: True for name in ("tools", "structured_outputs") if getattr(self.config, name)},
            # Sent only when it waits: a pop without it is the AI Horde's own.
            **({"wait_seconds": self.config.pop_wait} if self.config.pop_wait > 0 else {}),
        }

    async def _slot(self) -> None:
        while not self.stopping.is_set():
            if self.backend_down.is_set():
                await self._wait_for_backend()
                continue
            # The deadline counts from before the pop: the horde counts it from its answer, so
            # the bridge stops first, never after the horde has refused the job.
            popped_at = time.monotonic()
            try:
                answer = await self._pop()
            except HordeUnreachable as exc:
                log.warning("pop not delivered (%s); trying again", exc)
                continue
            if answer is None:
                break  # stopped while the pop waited: it was dropped, nothing was popped for it
            self._note_messages(answer.body.get("messages"))
            if answer.rc == "WorkerMaintenance":
                log.warning(
                    "the worker is in maintenance (%s); popping again in %ss",
                    answer.message,
                    self.config.maintenance_wait,
                )
                await self._wait_or_stop(self.config.maintenance_wait)
                continue
            if answer.status != 200:
                raise Fatal(f"pop answered {answer.status} {answer.rc}: {answer.message}")
            if not answer.body.get("id"):
                # A pop that waited at the horde is followed by the next at once; one that did
                # not (the AI Horde, a horde without Redis) by the rest of `pop_interval`.
                await self._wait_or_stop(self.config.pop_interval - (time.monotonic() - popped_at))
                continue
            await self._serve(Job.from_pop(answer.body), popped_at)
            if self.config.once:
                self.stopping.set()

    async def _pop(self):
        """The pop's answer, or None when the bridge stops while the pop waits: the request is
        dropped, and the horde pops nothing for a client that left."""
        pop = asyncio.ensure_future(self.horde.pop(self.pop_body()))
        if not self.config.pop_wait:
            return await pop
        stop = asyncio.ensure_future(self.stopping.wait())
        try:
            await asyncio.wait({pop, stop}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop.cancel()
        if pop.done():
            return pop.result()
        pop.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await pop
        return None

    async def _serve(self, job: Job, popped_at: float) -> None:
        # Filled by the job as it goes: a job cancelled at the stop is logged with what it did.
        served = Served(Outcome.SUBMITTED)
        task = asyncio.create_task(self.server.serve(job, popped_at=popped_at, served=served))
        self.running[job.id] = task
        try:
            await asyncio.wait({task})
        finally:
            del self.running[job.id]
        if task.cancelled():
            served.detail = "stopped"
            served = await self.server.give_back(job, served)
            served.seconds = time.monotonic() - popped_at
        else:
            served = task.result()  # Fatal comes out here
        self.last_outcome = served.outcome
        if served.outcome is Outcome.GIVEN_BACK and served.detail.startswith("backend failed"):
            self.backend_down.set()
        self._log(job, served)

    def _log(self, job: Job, served: Served) -> None:
        rate = served.tokens / served.seconds if served.seconds > 0 else 0.0
        line = (
            f"job {job.id} ({job.kind}, {job.model}): {served.outcome.value}, {served.tokens} tokens "
            f"in {served.seconds:.1f}s ({rate:.1f} tokens/s)"
        )
        if job.posts_progress:
            line += f", {served.posts} progress posts, lease {served.lease}"
        if served.detail:
            line += f"; {served.detail}"
        level = logging.INFO if served.outcome is Outcome.SUBMITTED else logging.WARNING
        log.log(level, line)

    def _note_messages(self, messages: Any) -> None:
        """Moderators' messages to the worker, each logged once."""
        for message in messages or []:
            if not isinstance(message, dict):
                continue
            key = str(message.get("id") or message.get("message"))
            if key not in self.seen_messages:
                self.seen_messages.add(key)
                log.warning("message from the horde's moderators: %s", message.get("message"))

    async def aclose(self) -> None:
        await self.horde.aclose()
        await self.backend.aclose()
