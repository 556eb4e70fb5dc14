"""Serving one job: generate from the backend, stream its output as progress, submit.

A chat job's deltas (and a streamed text completion's) are posted as they come, coalesced: a
post goes out once `every_tokens` tokens wait, or once `every_seconds` passed since the last
post, and only one post of a job is in flight at a time (what comes meanwhile waits for the
next one). The first output is posted
at once, because the requester is waiting for it.

The horde's answers are obeyed: `AbortedGen` and `GenerationCancelled` (and `DuplicateGen`,
`InvalidJobID`) mean the job is no longer ours, `lapsed` means it is about to be taken back;
each closes the backend's stream at once, so the model server stops generating. After
`lapsed` the job is given back, so the requester hears of it now rather than at the next
cleanup pass. `at_cap` means no more renewals: generation stops in time to submit what there is
before the lease ends. A pop's `deadline_ms` ends generation the same way (the requester has had
its answer by then, so nothing is sent).
"""

import asyncio
import contextlib
import enum
import logging
import re
import time
from dataclasses import dataclass, field
from typing import Any

from hordeops_bridge.backends import Backend, BackendError, Delta
from hordeops_bridge.horde import Fatal, Horde, HordeUnreachable
from hordeops_bridge.job import DoesNotFit, Job, Request, context_budget, fit, request_for

log = logging.getLogger("hordeops_bridge.job")

# Lease answers that end the job for this worker, and what they mean to it.
LOST = {"AbortedGen", "GenerationCancelled", "DuplicateGen", "InvalidJobID"}
# Seconds kept between stopping at the lease's end (`at_cap`) and that end, for the submit.
SUBMIT_MARGIN_SECONDS = 5.0


class Outcome(enum.Enum):
    SUBMITTED = "submitted"
    LOST = "lost"  # the horde took the job back, or the requester left: nothing to send
    DEADLINE = "deadline"  # the requester's deadline passed: nothing to send
    GIVEN_BACK = "given back"
    UNDELIVERED = "undelivered"  # the horde could not be reached to submit


class JobLost(Exception):
    def __init__(self, rc: str) -> None:
        super().__init__(rc)
        self.rc = rc


class LeaseLapsed(Exception):
    """A progress post came after the lease ended: the job is about to be taken back."""


@dataclass
class Progress:
    """The progress posts of one chat job.

    A post, once sent, is frozen: until the horde answers it, every retry resends the same `seq`
    and `delta` (the first attempt may have landed; a retry is then recognised and not relayed
    twice). Output that comes meanwhile waits for the next post.
    """

    horde: Horde
    job_id: str
    every_tokens: int
    every_seconds: float
    verbose: bool = False
    acked: list[str] = field(default_factory=list)  # seq i + 1 is acked[i]
    pending: list[str] = field(default_factory=list)
    # Tool-call pieces, as the text beside them: acked_calls[i] went with seq i + 1.
    acked_calls: list[list[dict[str, Any]]] = field(default_factory=list)
    pending_calls: list[dict[str, Any]] = field(default_factory=list)
    pending_tokens: int = 0
    tokens: int = 0
    lease: str = "granted"
    expires_in: float | None = None  # seconds of lease left at the last answer, on our clock
    answered_at: float = 0.0
    last_post: float = float("-inf")
    closed: bool = False
    enabled: bool = True
    _changed: asyncio.Event = field(default_factory=asyncio.Event)

    def add(self, delta: Delta) -> None:
        if delta.text or delta.tool_calls:
            self.pending.append(delta.text)
            self.pending_calls.extend(delta.tool_calls)
            self.pending_tokens += max(1, delta.tokens - self.tokens)
        self.tokens = max(self.tokens, delta.tokens)
        self._changed.set()

    def close(self) -> None:
        """No more output: post what is left, then stop."""
        self.closed = True
        self._changed.set()

    def _due_in(self) -> float | None:
        """Seconds until a post is due (0: now); None when nothing waits."""
        if not self.pending:
            return None
        if self.closed or not self.acked or self.pending_tokens >= self.every_tokens:
            return 0.0
        return max(0.0, self.last_post + self.every_seconds - time.monotonic())

    async def run(self) -> None:
        """Post until closed and flushed; raises JobLost or LeaseLapsed when the job is gone."""
        in_flight: dict[str, Any] | None = None
        while True:
            due = self._due_in()
            if in_flight is None and due is None and self.closed:
                return
            if in_flight is None and (due is None or due > 0):
                self._changed.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._changed.wait(), timeout=due)
                continue
            if in_flight is None:
                in_flight = {
                    "id": self.job_id,
                    "seq": len(self.acked) + 1,
                    "delta": "".join(self.pending),
                    "tokens": self.tokens,
                }
                if self.pending_calls:  # hordeops's own field, only when there are pieces
                    in_flight["tool_calls"] = merged(self.pending_calls)
                self.pending, self.pending_tokens, self.pending_calls = [], 0, []
            self.last_post = time.monotonic()
            if not self.enabled:
                return
            in_flight = await self._post(in_flight)

    async def _post(self, body: dict[str, Any]) -> dict[str, Any] | None:
        """Post `body`; None once it is settled, the body itself to send it again."""
        try:
            answer = await self.horde.progress(body)
        except HordeUnreachable as exc:
            log.warning(
                "job %s: progress seq %d not delivered (%s); will resend", self.job_id, body["seq"], exc
            )
            return body
        if answer.status == 200:
            self.acked.append(body["delta"])
            self.acked_calls.append(body.get("tool_calls", []))
            self._note_lease(answer.body)
            return None
        if answer.rc == "ProgressOutOfOrder":
            self._rewind(answer.body, body)
            return None
        if answer.rc in LOST:
            raise JobLost(answer.rc)
        if answer.status in (401, 403):
            raise Fatal(f"progress answered {answer.status} {answer.rc}")
        # A bug on one side: stop posting, let the submit decide.
        log.error(
            "job %s: progress answered %s %s; no more progress posts", self.job_id, answer.status, answer.rc
        )
        self.enabled = False
        return None

    def _rewind(self, answer: dict[str, Any], body: dict[str, Any]) -> None:
        """409 ProgressOutOfOrder: resend everything after the horde's last accepted seq."""
        last = answer.get("last_seq")
        if not isinstance(last, int):
            found = re.search(r"last accepted seq is (\d+)", str(answer.get("message", "")))
            last = int(found.group(1)) if found else 0
        log.warning("job %s: progress out of order, resending from seq %d", self.job_id, last + 1)
        self.pending = self.acked[last:] + [body["delta"]] + self.pending
        resent = [piece for pieces in self.acked_calls[last:] for piece in pieces]
        self.pending_calls = resent + body.get("tool_calls", []) + self.pending_calls
        self.pending_tokens = self.every_tokens
        self.acked = self.acked[:last]
        self.acked_calls = self.acked_calls[:last]

    def _note_lease(self, answer: dict[str, Any]) -> None:
        lease = answer.get("lease")
        ttl = answer.get("ttl")
        self.answered_at = time.monotonic()
        self.expires_in = float(ttl) if isinstance(ttl, int | float) else None
        if self.verbose:
            log.info("job %s: seq %d, lease %s, ttl %s", self.job_id, len(self.acked), lease, ttl)
        if lease != self.lease and lease in ("at_cap", "lapsed"):
            log.warning("job %s: lease %s, %ss left", self.job_id, lease, ttl)
        self.lease = str(lease)
        if lease == "lapsed":
            raise LeaseLapsed()

    def lease_end(self) -> float | None:
        """When, on our clock, the lease ends if it cannot be renewed any more (at its cap)."""
        if self.lease != "at_cap" or self.expires_in is None:
            return None
        return self.answered_at + self.expires_in


def merged(pieces: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Consecutive pieces of one call as one: its id and name kept, its argument fragments
    joined (some servers repeat the id and name in every piece)."""
    out: list[dict[str, Any]] = []
    for piece in pieces:
        function = piece.get("function") or {}
        last = out[-1] if out else {}
        same = (
            last.get("index") == piece["index"]
            and piece.get("id", last.get("id")) == last.get("id")
            and function.get("name", (last.get("function") or {}).get("name"))
            == (last.get("function") or {}).get("name")
        )
        if same:
            last = out[-1].setdefault("function", {})
            last["arguments"] = last.get("arguments", "") + function.get("arguments", "")
            continue
        out.append({**piece, "function": dict(function)} if function else dict(piece))
    return out


@dataclass
class Output:
    pieces: list[str] = field(default_factory=list)
    tokens: int = 0  # the backend's count
    calls: dict[int, dict[str, Any]] = field(default_factory=dict)  # by index, as they came

    @property
    def text(self) -> str:
        return "".join(self.pieces)

    def add_calls(self, pieces: tuple[dict[str, Any], ...]) -> None:
        for piece in pieces:
            call = self.calls.setdefault(piece["index"], {"id": "", "name": "", "arguments": ""})
            function = piece.get("function") or {}
            call["id"] = call["id"] or piece.get("id", "")
            call["name"] = call["name"] or function.get("name", "")
            call["arguments"] += function.get("arguments", "")

    def tool_calls(self) -> list[dict[str, Any]]:
        """The reply's calls whole, in OpenAI's form, in index order (an id made up where the
        backend gave none)."""
        return [
            {
                "id": call["id"] or f"call_{index}",
                "type": "function",
                "function": {"name": call["name"], "arguments": call["arguments"]},
            }
            for index, call in sorted(self.calls.items())
        ]


@dataclass
class Served:
    outcome: Outcome
    tokens: int = 0
    seconds: float = 0.0
    posts: int = 0
    lease: str = ""
    detail: str = ""


class JobServer:
    """Serves jobs from one backend to one horde, with the bridge's settings."""

    def __init__(
        self,
        horde: Horde,
        backend: Backend,
        *,
        context_limit: int,
        every_tokens: int,
        every_seconds: float,
        verbose: bool = False,
    ) -> None:
        self.horde = horde
        self.backend = backend
        self.context_limit = context_limit
        self.every_tokens = every_tokens
        self.every_seconds = every_seconds
        self.verbose = verbose

    async def serve(self, job: Job, *, popped_at: float, served: Served | None = None) -> Served:
        """Generate and submit `job`, popped at `popped_at` (time.monotonic()); never raises
        for the job's own troubles, only for Fatal and cancellation (the caller gives it back).
        `served` is filled as the job ends, cancelled too: a caller that cancels still has its
        tokens and progress posts."""
        served = Served(Outcome.SUBMITTED) if served is None else served
        started = time.monotonic()
        deadline = popped_at + job.deadline_ms / 1000 if job.deadline_ms is not None else None
        budget = context_budget(job, context_limit=self.context_limit)
        try:
            request = await fit(request_for(job), budget=budget, count=self.backend.count_tokens)
        except DoesNotFit as exc:
            served.detail = f"refused: {exc}"
            return await self.give_back(job, served)
        except BackendError as exc:
            served.detail = f"backend failed: {exc}"
            return await self.give_back(job, served)
        if request.fitted:
            log.warning("job %s: did not fit its %d tokens of context: %s", job.id, budget, request.fitted)
        progress = Progress(
            self.horde, job.id, self.every_tokens, self.every_seconds, verbose=self.verbose
        ) if job.posts_progress else None  # fmt: skip
        output = Output()
        try:
            await self._generate(job, request, budget, output, progress, deadline)
        except (JobLost, LeaseLapsed, TimeoutError, BackendError) as exc:
            served.outcome, served.detail = self._ended(job, exc)
        finally:
            served.tokens = output.tokens
            served.seconds = time.monotonic() - started
            served.posts = len(progress.acked) if progress else 0
            served.lease = progress.lease if progress else ""
        if served.outcome is Outcome.GIVEN_BACK:
            return await self.give_back(job, served)
        if served.outcome is not Outcome.SUBMITTED:
            return served
        return await self.submit(
            job, output.text, served, seed=request.seed or 0, tool_calls=output.tool_calls()
        )

    async def _generate(
        self,
        job: Job,
        request: Request,
        budget: int,
        output: Output,
        progress: Progress | None,
        deadline: float | None,
    ) -> None:
        """Run the backend's stream (and the progress posts) until done, lost or out of time."""
        loop = asyncio.get_running_loop()

        async def read() -> None:
            async with contextlib.aclosing(self.backend.generate(request, budget=budget)) as deltas:
                async for delta in deltas:
                    output.pieces.append(delta.text)
                    output.add_calls(delta.tool_calls)
                    output.tokens = max(output.tokens, delta.tokens)
                    if progress is not None:
                        progress.add(delta)
                    if stop_at := (progress.lease_end() if progress else None):
                        if time.monotonic() >= stop_at - SUBMIT_MARGIN_SECONDS:
                            log.warning(
                                "job %s: stopped before its lease's cap ends, to submit in time", job.id
                            )
                            return

        reader = asyncio.create_task(read())
        poster = asyncio.create_task(progress.run()) if progress is not None else None
        try:
            async with asyncio.timeout_at(
                None if deadline is None else loop.time() + (deadline - time.monotonic())
            ):
                waiting = {reader} | ({poster} if poster else set())
                done, _ = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
                if poster is not None and poster in done and poster.exception() is not None:
                    raise poster.exception()
                await reader  # the backend's errors come out here
                if poster is not None:
                    progress.close()
                    await poster  # the last post, with the final count, before the submit
        finally:
            for task in (reader, poster):
                if task is None:
                    continue
                if not task.done():
                    task.cancel()
                # Also reads the error of a task that ended as the other did (a post answered
                # GenerationCancelled just as the deadline passed): nobody else will.
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task

    def _ended(self, job: Job, exc: BaseException) -> tuple[Outcome, str]:
        """The outcome and its detail of a job that `exc` ended."""
        if isinstance(exc, JobLost):
            return Outcome.LOST, exc.rc
        if isinstance(exc, LeaseLapsed):
            return Outcome.GIVEN_BACK, "lease lapsed"
        if isinstance(exc, TimeoutError):
            return Outcome.DEADLINE, f"deadline {job.deadline_ms} ms"
        return Outcome.GIVEN_BACK, f"backend failed: {exc}"

    async def submit(
        self,
        job: Job,
        text: str,
        served: Served,
        *,
        seed: int,
        tool_calls: list[dict[str, Any]] | None = None,
    ) -> Served:
        try:
            answer = await self.horde.submit(job.id, text, seed=seed, tool_calls=tool_calls)
        except HordeUnreachable as exc:
            served.outcome, served.detail = Outcome.UNDELIVERED, str(exc)
            return served
        if answer.status == 200 or answer.rc == "DuplicateGen":
            # DuplicateGen: a retried submit whose first attempt landed.
            return served
        served.outcome = Outcome.LOST
        served.detail = f"submit answered {answer.status} {answer.rc}"
        return served

    async def give_back(self, job: Job, served: Served) -> Served:
        """Submit the job as faulted, so the horde restarts it at once rather than at its lease's end."""
        served.outcome = Outcome.GIVEN_BACK
        try:
            answer = await self.horde.submit(job.id, "", state="faulted")
        except HordeUnreachable as exc:
            served.detail += f"; not delivered ({exc}), the job will lapse"
            return served
        if answer.status != 200:
            served.detail += f"; the give-back answered {answer.status} {answer.rc}"
        return served
