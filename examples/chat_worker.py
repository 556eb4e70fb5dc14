"""A small hordeops chat worker: pop a job, stream progress while generating, submit.

Run it against a local stack (`bin/stack`) with an account's API key:

    .venv/bin/python manage.py create_account alice      # the key is the last line
    .venv/bin/python examples/chat_worker.py --apikey KEY --name alice-echo --model example-echo

It pops with `chat: true`, so it gets chat jobs (`kind: "chat"`) as well as plain text jobs
(`kind: "text"`). For a chat job it posts progress every few words, which relays the words to
the requester and renews the job's lease; a text job keeps its flat lease and gets no
progress posts. The "model" is `fake_llm` below, which answers every job with a canned reply
word by word: that function is the place to plug a real backend.

Only the standard library and httpx. Its log carries job ids, counts and lease answers, never
the prompt or the reply. `--once` serves one job and exits: 0 when the job was submitted and
accepted, 1 when it ended otherwise (cancelled, aborted, given back), 2 on an error no
retry can fix (a bad key, a worker name owned by another account).
"""

import argparse
import logging
import re
import sys
import time
from collections.abc import Iterator
from typing import Any

import httpx

log = logging.getLogger("chat_worker")

BRIDGE_AGENT = "hordeops-example-chat-worker:1:https://example.invalid/hordeops"
CANNED_REPLY = (
    "Hello! This reply comes from the hordeops example worker, which does not run a model. "
    "It sends the same canned words for every job, a few at a time, so that you can watch "
    "the progress posts stream to the requester and renew the job's lease."
)
# Seconds before the retries of one call: network errors and 502/503/504 answers.
RETRY_DELAYS = (0.5, 1, 2, 4, 8, 8, 8)
POP_IDLE_SECONDS = 2.0
MAINTENANCE_WAIT_SECONDS = 60.0
# A progress post goes out when this many seconds passed since the last one, whatever
# the word count: the lease step is 150 s, so a post at least every few seconds keeps a
# streaming job far from its lease end.
PROGRESS_MAX_SECONDS = 2.0


# --- The model: replace this ----------------------------------------------------------------


def fake_llm(job: dict[str, Any], *, word_delay: float) -> Iterator[str]:
    """Yield the reply to one job piece by piece, as a streaming backend would.

    THIS IS THE PLACE TO PLUG A REAL BACKEND. `job["payload"]` holds what to generate:
    `messages` (chat jobs: a list of `{"role", "content"}` with string content), `prompt`
    (always: chat jobs get the messages rendered as one ChatML prompt), `max_length` (the
    most tokens to generate), and the sampling knobs the requester set (`temperature`,
    `top_p`, `stop_sequence`). Stream from your server (llama.cpp, vLLM, KoboldCpp, ...)
    and yield each token's text as it arrives. This fake yields one word per "token" and
    ignores everything but `max_length`.
    """
    max_tokens = job["payload"].get("max_length", 80)
    for index, word in enumerate(CANNED_REPLY.split(" ")):
        if index >= max_tokens:
            return
        time.sleep(word_delay)  # a real backend spends this time generating
        yield word if index == 0 else " " + word


# --- The horde ----------------------------------------------------------------------------------


class Fatal(Exception):
    """An answer no retry will change: a bad key or a worker name owned by another account."""


class Horde:
    """The worker routes under /api/v2, with retries that resend the same body."""

    def __init__(self, url: str, apikey: str, *, transport: httpx.BaseTransport | None = None) -> None:
        self.client = httpx.Client(
            base_url=url.rstrip("/") + "/api/v2/generate/text/",
            headers={"apikey": apikey, "Client-Agent": BRIDGE_AGENT},
            timeout=httpx.Timeout(30.0, connect=10.0),
            transport=transport,
        )

    def close(self) -> None:
        self.client.close()

    def post(self, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        """POST `body`; on a network error or a 502/503/504, wait and send the same body again.

        Resending is safe on every worker route: a pop that lost its answer leaves a job that
        lapses and is restarted, a progress post repeated under the same `seq` is a retry the
        horde does not relay twice, and a repeated submit answers DuplicateGen.
        """
        for attempt, delay in enumerate((*RETRY_DELAYS, None), start=1):
            try:
                response = self.client.post(path, json=body)
            except httpx.TransportError as exc:
                problem = type(exc).__name__
            else:
                if response.status_code not in (502, 503, 504):
                    try:
                        answer = response.json()
                    except ValueError:
                        answer = {}
                    return response.status_code, answer if isinstance(answer, dict) else {}
                problem = f"HTTP {response.status_code}"
            if delay is None:
                raise ConnectionError(f"{path}: {problem}, {attempt} attempts")
            log.warning("%s: %s, retrying in %ss (attempt %d)", path, problem, delay, attempt)
            time.sleep(delay)
        raise AssertionError("unreachable")


# --- Progress -----------------------------------------------------------------------------------


class JobLost(Exception):
    """The horde took the job back: stop generating and do not submit."""

    def __init__(self, rc: str, message: str) -> None:
        super().__init__(rc)
        self.rc = rc
        self.message = message


class Progress:
    """The progress posts of one chat job.

    A post, once sent, is frozen: until the horde answers it, every retry resends the same
    `seq` and the same `delta` (the first attempt may have landed; a retry of it is then
    recognised and not relayed twice). Text generated meanwhile waits for the next post.
    """

    def __init__(self, horde: Horde, job_id: str, *, every_words: int) -> None:
        self.horde = horde
        self.job_id = job_id
        self.every_words = every_words
        self.acked: list[str] = []  # the deltas the horde accepted: seq i + 1 is acked[i]
        self.in_flight: dict[str, Any] | None = None
        self.pending: list[str] = []
        self.tokens = 0
        self.last_post = time.monotonic()
        self.lease = "granted"
        self.enabled = True

    def add(self, piece: str) -> None:
        self.pending.append(piece)
        self.tokens += 1
        if not self.enabled:
            return
        due = time.monotonic() - self.last_post >= PROGRESS_MAX_SECONDS
        if len(self.pending) >= self.every_words or due:
            self.flush()

    def flush(self) -> None:
        """Post what is pending (after any post still unanswered). Raise JobLost if it is gone."""
        while self.enabled and (self.in_flight is not None or self.pending):
            if self.in_flight is None:
                self.in_flight = {
                    "id": self.job_id,
                    "seq": len(self.acked) + 1,
                    "delta": "".join(self.pending),
                    "tokens": self.tokens,
                }
                self.pending = []
            if not self._post(self.in_flight):
                return  # the horde is unreachable: keep the post and try again later

    def _post(self, body: dict[str, Any]) -> bool:
        self.last_post = time.monotonic()
        try:
            status, answer = self.horde.post("progress", body)
        except ConnectionError as exc:
            log.warning("job %s: progress seq %d not delivered (%s)", self.job_id, body["seq"], exc)
            return False
        rc = answer.get("rc", "")
        if status == 200:
            self.acked.append(body["delta"])
            self.in_flight = None
            self._note_lease(answer)
            return True
        if rc == "ProgressOutOfOrder":
            self._rewind(answer)
            return True
        if rc in ("AbortedGen", "GenerationCancelled", "DuplicateGen", "InvalidJobID"):
            raise JobLost(rc, answer.get("message", ""))
        if status in (401, 403):
            raise Fatal(f"progress: {rc or status}")
        # Anything else is a bug on one side: stop posting progress, let the submit decide.
        log.error("job %s: progress answered %s %s; no more progress posts", self.job_id, status, rc)
        self.enabled = False
        return False

    def _rewind(self, answer: dict[str, Any]) -> None:
        """409 ProgressOutOfOrder: resend everything after the horde's last accepted seq."""
        last = answer.get("last_seq")
        if not isinstance(last, int):
            found = re.search(r"last accepted seq is (\d+)", answer.get("message", ""))
            last = int(found.group(1)) if found else 0
        log.warning("job %s: progress out of order, resending from seq %d", self.job_id, last + 1)
        unsent = self.acked[last:] + ([self.in_flight["delta"]] if self.in_flight else []) + self.pending
        self.acked = self.acked[:last]
        self.in_flight = None
        self.pending = unsent

    def _note_lease(self, answer: dict[str, Any]) -> None:
        lease = answer.get("lease")
        if lease != self.lease and lease in ("at_cap", "lapsed"):
            # at_cap: no more renewals, finish before expires_at. lapsed: the stale pass may
            # abort the job at any moment; a submit that gets there first is still accepted.
            log.warning("job %s: lease %s, expires %s", self.job_id, lease, answer.get("expires_at"))
        log.debug("job %s: seq %d, lease %s, ttl %s", self.job_id, len(self.acked), lease, answer.get("ttl"))
        self.lease = lease


# --- The worker ---------------------------------------------------------------------------------


class ChatWorker:
    def __init__(self, horde: Horde, args: argparse.Namespace) -> None:
        self.horde = horde
        self.args = args

    def pop(self) -> dict[str, Any] | None:
        status, answer = self.horde.post(
            "pop",
            {
                "name": self.args.name,
                "models": [self.args.model],
                "max_length": self.args.max_length,
                "max_context_length": self.args.max_context_length,
                "threads": 1,
                "amount": 1,
                "chat": True,
                "bridge_agent": BRIDGE_AGENT,
            },
        )
        if status == 200:
            return answer if answer.get("id") else None
        rc = answer.get("rc", "")
        if rc == "WorkerMaintenance":
            log.warning("worker is in maintenance; waiting %ss", MAINTENANCE_WAIT_SECONDS)
            time.sleep(MAINTENANCE_WAIT_SECONDS)
            return None
        raise Fatal(f"pop answered {status} {rc}: {answer.get('message', '')}")

    def serve(self, job: dict[str, Any]) -> bool:
        """Generate and submit one job; True when the horde accepted the result."""
        job_id, kind = job["id"], job.get("kind") or "text"
        lease = job.get("lease") or {}
        log.info(
            "job %s: %s job for %s, max_length %s, lease until %s (cap %ss from the pop)",
            job_id,
            kind,
            job.get("model"),
            job["payload"].get("max_length"),
            lease.get("expires_at"),
            lease.get("cap_seconds"),
        )
        started = time.monotonic()
        # The requester's remaining budget at the pop, when it set a deadline: past it, the
        # requester has had its answer (a 504 or an error event) and the horde refuses this
        # job's posts, so generating on is wasted work. Counted on this machine's own clock
        # from the pop's answer: no clock is shared with the horde.
        deadline = started + job["deadline_ms"] / 1000 if job.get("deadline_ms") is not None else None
        progress = Progress(self.horde, job_id, every_words=self.args.progress_every)
        pieces: list[str] = []
        try:
            for piece in fake_llm(job, word_delay=self.args.word_delay):
                if deadline is not None and time.monotonic() >= deadline:
                    log.warning(
                        "job %s: stopped at its deadline (%d ms from the pop)", job_id, job["deadline_ms"]
                    )
                    return False
                pieces.append(piece)
                if kind == "chat":
                    progress.add(piece)
            if kind == "chat":
                # The submit has no token count: the horde takes the one of the last post.
                progress.flush()
        except JobLost as lost:
            log.warning("job %s: stopped, %s: %s", job_id, lost.rc, lost.message)
            return False
        except Fatal:
            raise
        except KeyboardInterrupt:
            self.submit(job_id, "", state="faulted")
            raise
        except Exception as exc:  # the backend failed: give the job back at once
            log.error("job %s: generation failed (%s); giving it back", job_id, type(exc).__name__)
            self.submit(job_id, "", state="faulted")
            return False
        accepted = self.submit(job_id, "".join(pieces))
        if accepted:
            log.info(
                "job %s: submitted %d tokens in %.1fs after %d progress posts",
                job_id,
                len(pieces),
                time.monotonic() - started,
                len(progress.acked),
            )
        return accepted

    def submit(self, job_id: str, text: str, *, state: str = "ok") -> bool:
        body = {"id": job_id, "generation": text, "state": state, "seed": 0}
        try:
            status, answer = self.horde.post("submit", body)
        except ConnectionError as exc:
            log.error("job %s: submit not delivered (%s); the job will lapse", job_id, exc)
            return False
        if status == 200:
            return state == "ok"
        rc = answer.get("rc", "")
        if rc == "DuplicateGen":
            # A retried submit whose first attempt landed, or a second submit: done either way.
            return True
        log.warning("job %s: submit answered %s %s: %s", job_id, status, rc, answer.get("message", ""))
        return False

    def run(self) -> int:
        while True:
            try:
                job = self.pop()
            except ConnectionError as exc:
                log.warning("pop not delivered (%s); trying again", exc)
                continue
            if job is None:
                time.sleep(POP_IDLE_SECONDS)
                continue
            accepted = self.serve(job)
            if self.args.once:
                return 0 if accepted else 1


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="A hordeops chat worker that streams a canned reply.")
    parser.add_argument("--url", default="http://127.0.0.1:8000", help="the horde's base URL")
    parser.add_argument("--apikey", required=True, help="the API key of the account that owns the worker")
    parser.add_argument("--name", required=True, help="the worker's name (created by its first pop)")
    parser.add_argument("--model", default="example-echo", help="the model name the worker serves")
    parser.add_argument("--max-length", type=int, default=1024, help="most tokens per reply it accepts")
    parser.add_argument(
        "--max-context-length", type=int, default=4096, help="most prompt plus reply tokens it accepts"
    )
    parser.add_argument("--progress-every", type=int, default=4, help="words per progress post")
    parser.add_argument("--word-delay", type=float, default=0.1, help="seconds per generated word")
    parser.add_argument("--once", action="store_true", help="serve one job, then exit")
    parser.add_argument("--verbose", action="store_true", help="log every progress answer")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None, *, transport: httpx.BaseTransport | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # it would log every call's URL
    log.setLevel(logging.DEBUG if args.verbose else logging.INFO)
    horde = Horde(args.url, args.apikey, transport=transport)
    try:
        return ChatWorker(horde, args).run()
    except Fatal as exc:
        log.error("%s", exc)
        return 2
    except KeyboardInterrupt:
        return 130
    finally:
        horde.close()


if __name__ == "__main__":
    sys.exit(main())
