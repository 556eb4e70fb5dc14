"""What a chat stream's follower and the ASGI handler sending it share (neither imports the other).

A follower whose requester is too far behind (`jobs/relay_hub.py`, STREAM_QUEUE_MAX_BYTES) calls
`Stall.stall`: a send blocked on the requester's full connection is woken at once, rather than
at STREAM_SEND_TIMEOUT_SECONDS, and the stream ends (`hordeops/asgi.py` `send_response`).
"""

import asyncio


class Stall:
    def __init__(self) -> None:
        self.stalled = False
        self.sending = False  # a send of the stream is awaited now
        self.task: asyncio.Task | None = None  # the task that sends the stream

    def stall(self) -> None:
        self.stalled = True
        # Only a blocked send is woken: anywhere else the stream reads StreamStalled itself next.
        if self.sending and self.task is not None:
            self.task.cancel()
