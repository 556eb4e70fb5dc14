"""The bridge bench's reading of a 16-stream run: what the horde adds beyond the engine's queue."""

from types import SimpleNamespace

from bench.bridge import _beyond_engine_queue

CHAT = "/v1/chat/completions"


def _run(calls: list[tuple[str, float, float, list[float], float]]):
    """A proxy's record and the requesters' streams: for each stream its send, its call reaching
    the engine, its tokens passing the proxy and its first piece reaching the requester."""
    proxy = SimpleNamespace(arrived={}, passed={})
    streams = []
    for content, sent, asked, tokens, first_piece in calls:
        proxy.arrived[(CHAT, content)] = [asked]
        proxy.passed[content] = [(at, index + 1) for index, at in enumerate(tokens)]
        streams.append((content, {"sent": sent, "pieces": [(first_piece, 1)]}))
    return proxy, streams


def test_a_call_that_waits_behind_another_stream_adds_only_its_relay():
    proxy, streams = _run(
        [
            ("a", 0.0, 0.010, [0.050, 1.000], 0.052),
            # Reached the engine at 0.4 s, while it served "a" until 1.0 s: not late.
            ("b", 0.0, 0.400, [1.030, 2.000], 1.035),
        ]
    )
    assert [round(x, 3) for x in _beyond_engine_queue(proxy, streams)] == [0.012, 0.015]


def test_the_engine_waiting_idle_for_a_call_puts_off_every_stream_after_it():
    proxy, streams = _run(
        [
            ("a", 0.0, 0.010, [0.050, 1.000], 0.051),
            # The engine was free at 1.0 s and its call came at 1.2 s: 0.2 s idle, for "b" and "c".
            ("b", 0.0, 1.200, [1.230, 2.000], 1.231),
            ("c", 0.0, 0.020, [2.030, 3.000], 2.031),
        ]
    )
    assert [round(x, 3) for x in _beyond_engine_queue(proxy, streams)] == [0.011, 0.211, 0.211]


def test_streams_are_taken_in_the_order_the_engine_served_them():
    proxy, streams = _run(
        [
            ("late", 0.0, 0.300, [1.030, 2.000], 1.032),
            ("first", 0.0, 0.005, [0.040, 1.000], 0.041),
        ]
    )
    assert [round(x, 3) for x in _beyond_engine_queue(proxy, streams)] == [0.006, 0.007]
