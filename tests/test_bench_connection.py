"""The benches' keep-alive client: it must not measure its own Nagle stall as the horde's latency."""

import socket

from bench.common import HTTPConnection


def test_the_bench_connection_turns_nagle_off_as_urllib3_and_httpx_do():
    with socket.create_server(("127.0.0.1", 0)) as server:
        connection = HTTPConnection("127.0.0.1", server.getsockname()[1], timeout=5)
        connection.connect()
        try:
            assert connection.sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
        finally:
            connection.close()
