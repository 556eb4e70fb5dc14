"""An example worker with no model behind it: the worker bridge (`bridge/`, `hordeops-bridge`)
with a canned reply for its backend. It shows where a backend plugs into the bridge, and it lets
a local stack's chat requests be answered without a model server.

    .venv/bin/python manage.py create_account alice      # the key is the last line
    .venv/bin/python examples/chat_worker.py --api_key=KEY --worker_name alice-echo --model example-echo

It takes the bridge's options (`--help`), and `--word_delay`, the seconds each word of the
reply takes. To serve a real model, run `hordeops-bridge` itself: docs/how-to/serve_chat_jobs.md.
"""

import argparse
import asyncio
import sys
from collections.abc import AsyncIterator

from hordeops_bridge.backends import Backend, BackendInfo, Delta
from hordeops_bridge.cli import main
from hordeops_bridge.job import Request, estimate_tokens

CANNED_REPLY = (
    "Hello! This reply comes from the hordeops example worker, which does not run a model. "
    "It sends the same canned words for every job, a few at a time, so that you can watch "
    "the progress posts stream to the requester and renew the job's lease."
)


class CannedBackend(Backend):
    """Answers every job with CANNED_REPLY, one word a token, as a streaming server would."""

    kind = "example"

    def __init__(self, model: str, *, word_delay: float) -> None:
        super().__init__("http://127.0.0.1:9")  # no server: nothing is ever sent there
        self.model = model
        self.word_delay = word_delay

    async def describe(self) -> BackendInfo:
        # What a request asks for unless it says otherwise (1024 tokens) must fit.
        return BackendInfo(model=self.model, max_length=4096, max_context_length=8192)

    async def count_tokens(self, text: str) -> int:
        return estimate_tokens(text)

    async def generate(self, request: Request, *, budget: int) -> AsyncIterator[Delta]:
        words = CANNED_REPLY.split(" ")
        for count, word in enumerate(words[: request.max_tokens], start=1):
            await asyncio.sleep(self.word_delay)  # a real backend spends this time generating
            yield Delta(word if count == 1 else " " + word, count)
        yield Delta(
            "", min(len(words), request.max_tokens), "length" if request.max_tokens < len(words) else "stop"
        )


if __name__ == "__main__":
    options = argparse.ArgumentParser(add_help=False)
    options.add_argument("--word_delay", type=float, default=0.05)
    ours, theirs = options.parse_known_args()
    sys.exit(
        main(
            theirs,
            backend=lambda config: CannedBackend(config.model or "example-echo", word_delay=ours.word_delay),
        )
    )
