"""The HTTP protocol of `bin/web`'s workers: uvicorn's httptools protocol, its request heads bounded.

uvicorn's httptools protocol arms no timer on a new connection nor while a head arrives (its
keep-alive timer is cancelled by the first byte of the next request), and keeps whatever head it
is sent, however slowly and however large. Here, per connection:

- a head (request line and headers) must be complete REQUEST_HEAD_SECONDS after the connection
  opens or, on a kept-alive one, after the first byte that follows the last answer (a blank line
  included: the parser skips those, and each would otherwise put off uvicorn's keep-alive close),
  else 408 and the connection is closed;
- a head may hold REQUEST_HEAD_MAX_BYTES, else 431 and closed: the bytes are counted after each
  read the parser takes, so at most one read (256 KiB) past the bound is ever held, and a head
  that ends within a read larger than the bound is measured once its headers are in;
- a process holds WEB_MAX_CONNECTIONS connections at most: the next is answered 503 and closed.

Bodies have their own bounds once the head is in (`hordeops/asgi.py`).
"""

import asyncio

import httptools
from django.conf import settings
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from hordeops import errors


class BoundedHeadProtocol(HttpToolsProtocol):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._head_seconds = settings.REQUEST_HEAD_SECONDS
        self._head_limit = settings.REQUEST_HEAD_MAX_BYTES
        self._max_connections = settings.WEB_MAX_CONNECTIONS
        self._head_timer: asyncio.TimerHandle | None = None
        self._in_head = False  # from a message's first byte until its headers are complete
        self._head_bytes = 0  # of the reads before this one, while in a head
        self._read_bytes = 0  # this read's
        self._between = False  # from a message's end until the next begins

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self._max_connections:
            self._refuse(errors.TooManyConnections())
            return
        self._arm_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_head_timer()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        # uvicorn's, but for a head refused by on_headers_complete: the parser is stopped by the
        # exception it raises, which uvicorn would log and answer as an invalid request (400).
        self._unset_keepalive_if_required()
        self._read_bytes = len(data)
        if self._between and self._head_timer is None and self.cycle.response_complete:
            self._arm_head_timer()  # the first byte after an answer: the next head's clock starts
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            if self.transport.is_closing():
                return
            msg = "Invalid HTTP request received."
            self.logger.warning(msg)
            self.send_400_response(msg)
            return
        except httptools.HttpParserUpgrade:
            if self._should_upgrade():
                self.handle_websocket_upgrade()
            else:
                self._unsupported_upgrade_warning()
        if self._in_head and not self.transport.is_closing():
            self._head_bytes += len(data)
            if self._head_bytes > self._head_limit:
                self._refuse(errors.HeadTooLarge())

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_head, self._head_bytes, self._between = True, 0, False
        if self._head_timer is None:
            self._arm_head_timer()

    def on_headers_complete(self) -> None:
        # Only a read larger than the bound may hide a head over it: then it is measured.
        if self._head_bytes + self._read_bytes > self._head_limit and self._head_size() > self._head_limit:
            self._refuse(errors.HeadTooLarge())
            raise _HeadRefused  # stops the parser: nothing after this head is taken
        self._in_head = False
        self._disarm_head_timer()
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._between = True

    def _head_size(self) -> int:
        """The bytes of the head just parsed: its request line and headers, less the optional
        white space around values, which the parser drops."""
        size = len(self.parser.get_method()) + len(self.url) + len(b"  HTTP/1.1\r\n\r\n")
        return size + sum(len(name) + len(value) + len(b": \r\n") for name, value in self.headers)

    def _arm_head_timer(self) -> None:
        self._disarm_head_timer()
        self._head_timer = self.loop.call_later(self._head_seconds, self._head_timed_out)

    def _disarm_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if not self.transport.is_closing():
            self._refuse(errors.HeadTimeout())

    def _refuse(self, err: errors.DomainError) -> None:
        """Answer `err` in the error shape of the head's path (the horde's before it is known)
        and close the connection."""
        self._disarm_head_timer()
        if self.cycle is None or self.cycle.response_complete:
            # Not while an answer is on its way (a pipelined head behind a stream): it would
            # land inside that answer. The connection is closed all the same.
            self.transport.write(_raw_response(self._head_path(), err))
        self.transport.close()

    def _head_path(self) -> str:
        """The path of the head being read, once its request line is complete (a header has
        come since the message began), else ""."""
        if not self._in_head or not self.headers:
            return ""
        try:
            return httptools.parse_url(self.url).path.decode("ascii", "replace")
        except httptools.HttpParserInvalidURLError:
            return ""


class _HeadRefused(Exception):
    pass


def _raw_response(path: str, err: errors.DomainError) -> bytes:
    from hordeops.api import error_response_for_path  # the app's, loaded by the time a head comes

    response = error_response_for_path(path, err)
    body = response.content
    lines = [f"HTTP/1.1 {response.status_code} {response.reason_phrase}"]
    lines += [f"{name}: {value}" for name, value in response.items() if name.lower() != "content-length"]
    lines += [f"content-length: {len(body)}", "connection: close", "", ""]
    return "\r\n".join(lines).encode("latin-1") + body
