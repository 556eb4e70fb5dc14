"""What the horde costs a volunteer's stream: the same chats sent to the engine directly and
through the horde (requester, relay, bridge, engine).

Run:  .venv/bin/python bench/bridge.py [--streams 1,4,16] [--tokens 400] [--first-tokens 20] [--warm 40]
        [--pop-interval 1] [--pop-wait 20]

(needs the engine: bin/engine-venv; about six minutes. The JSON goes to stdout, notes to stderr.)

It starts the stack as `bin/stack` does (database hordeops_bench_bridge, created and migrated if
missing; Redis database 7), llama.cpp's Python server with one thread on the tests' tiny model
(tests/bridge/engine.py, 512 wide and 6 blocks), a timing proxy in front of that server, and the
bridge (`.venv/bin/hordeops-bridge`, `--threads` the largest N) pointed at the proxy. The proxy
passes the engine's stream through as it comes and notes when each token passed it.

For each N in --streams, N streamed `/v1/chat/completions` at once (each its own prompt, greedy,
--tokens long), first to the engine, then to the horde. "Directly" is through the timing proxy
too, so that its own hop (a Python server, a connection per stream) is on both sides and what is
left is the horde's:

- `tokens_per_second`: all streams' tokens over the time from the first token to the last, each
  way, and `ratio` (horde over direct); `engine_cpu_seconds` the engine's CPU time each way.
  `wall_tokens_per_second` counts from the requests' send, so it includes the wait for a pop.
- `ttft_ms`: time to first token, p50 and p99 each way, and what the horde adds (`added_p99`:
  p99 over p99, which at N streams moves with the engine's rate through the streams before the
  last; `added_p99_at_equal_engine_cpu` the same over the direct p99 scaled by the engine's CPU
  time through the horde over its CPU time directly, so that a host making the engine slower or
  faster in one of the runs does not count, and the horde taking the engine's core does);
  `outside_engine` each stream's time outside the engine (its call reaching the proxy, its first
  token reaching the requester), whatever the engine's queue and rate: p99 each way, and what
  the horde adds to it; `beyond_engine_queue` the part of each stream's wait that the engine's
  queue does not explain (the engine serves one stream at a time: a call that reaches it while
  it serves another waits for that one's end, however early it came): the engine's idle time
  waiting for calls up to that stream, and its first token's way to the requester, p99 each
  way and what the horde adds (the 16-stream goal), and `engine_queue` the engine's own queue
  each way (from the first stream's first token to the last one's); `phases_p50` where the
  horde's first token waited: `to_bridge` from the send to the bridge's first call to the engine
  (the chat queued, the waiting pop answered), `fit` the bridge counting the prompt's tokens,
  `engine` from the bridge's chat call to its first token, `relay` from there to the requester
  (the first progress post, the stream's commitment, the SSE write).
- `delta_latency_ms`: for each piece the requester gets through the horde, the time from its last
  token passing the proxy to the piece reaching the requester (the post, the relay and the SSE
  write), p50 and p99; `from_first_token` the same from its first token, so it includes the
  bridge's coalescing (up to 16 tokens or 0.25 s).

First `first_token`: --first-tokens short chats (8 tokens) one at a time, each sent directly and
through the horde at a random moment 0.2-0.6 s after the last, the bridge idle in its waiting pop:
what the horde adds to the first token, p50, p99 and max, and the phases' p50.

Then `disconnect`: a requester reads part of a long stream through the horde and closes it; how
long the engine went on generating after that: its last token through the proxy, and when its
CPU use fell under a fifth of a core (read every 10 ms), each counted from the close.
"""

import argparse
import asyncio
import json
import multiprocessing
import os
import platform
import random
import shutil
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.common import (  # noqa: E402
    bench_env,
    create_account,
    empty_redis,
    free_port,
    percentile,
    prepare_database,
    python_loop_seconds,
    start_bridge,
    start_stack,
    terminate,
)
from tests.bridge.engine import ENGINE_PYTHON, Engine, write_model  # noqa: E402

DB_NAME = "hordeops_bench_bridge"
REDIS_DB = 7
MODEL_FILE = "hordeops-bench"
MODEL = f"openai/{MODEL_FILE}"
JSON = {"Content-Type": "application/json"}


class _ProxyServer(ThreadingHTTPServer):
    # The requesters open all their streams at once: the default backlog of 5 reset some.
    request_queue_size = 64


def note(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


class TimingProxy:
    """Passes requests to the engine; for each streamed chat, keyed by its last message, the
    (time.time(), characters so far) of each token that passed, and when each POST arrived,
    keyed by (path, its last message or the text it counts)."""

    def __init__(self, engine_url: str) -> None:
        self.engine_url = engine_url
        self.passed: dict[str, list[tuple[float, int]]] = {}
        self.arrived: dict[tuple[str, str], list[float]] = {}
        # One client for every pass-through: a client made per call costs tens of milliseconds
        # (its TLS context), which would count as the horde's.
        self.client = httpx.Client(timeout=None, limits=httpx.Limits(max_connections=64))
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = _ProxyServer(("127.0.0.1", self.port), self._handler())
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.client.close()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _reply(self, response: httpx.Response) -> None:
                self.send_response(response.status_code)
                self.send_header("Content-Type", response.headers.get("content-type", "application/json"))
                self.send_header("Content-Length", str(len(response.content)))
                self.end_headers()
                self.wfile.write(response.content)

            def do_GET(self) -> None:
                self._reply(proxy.client.get(proxy.engine_url + self.path, timeout=30))

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                request = json.loads(body or b"{}")
                last = (request.get("messages") or [{}])[-1].get("content")
                text = str(last or request.get("prompt") or request.get("content"))
                proxy.arrived.setdefault((self.path, text), []).append(time.time())
                if not request.get("stream"):
                    self._reply(
                        proxy.client.post(
                            proxy.engine_url + self.path, content=body, headers=JSON, timeout=60
                        )
                    )
                    return
                key = str((request.get("messages") or [{}])[-1].get("content") or request.get("prompt"))
                passed = proxy.passed.setdefault(key, [])
                characters = 0
                url = proxy.engine_url + self.path
                with proxy.client.stream("POST", url, content=body, headers=JSON) as answer:
                    self.send_response(answer.status_code)
                    self.send_header("Content-Type", "text/event-stream")
                    self.end_headers()  # HTTP/1.0: the stream ends when the connection closes
                    try:
                        for line in answer.iter_lines():
                            self.wfile.write(line.encode() + b"\n")
                            self.wfile.flush()
                            if line.startswith("data: {"):
                                choices = json.loads(line[6:]).get("choices") or [{}]
                                text = (choices[0].get("delta") or {}).get("content") or choices[0].get(
                                    "text"
                                )
                                if text:
                                    characters += len(text)
                                    passed.append((time.time(), characters))
                    except (BrokenPipeError, ConnectionResetError):
                        pass  # the bridge left: closing `answer` tells the engine

        return Handler


async def stream_chat(
    client: httpx.AsyncClient, url: str, content: str, tokens: int, headers: dict[str, str]
) -> dict[str, Any]:
    """One streamed chat: when it was sent, and (time.time(), characters so far) per piece."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": content}], "max_tokens": tokens,
            "temperature": 0, "stream": True}  # fmt: skip
    pieces: list[tuple[float, int]] = []
    finish = None
    characters = 0
    sent = time.time()
    async with client.stream("POST", url, json=body, headers=headers) as response:
        async for line in response.aiter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            if not chunk.get("choices"):
                continue
            choice = chunk["choices"][0]
            text = (choice.get("delta") or {}).get("content")
            if text:
                characters += len(text)
                pieces.append((time.time(), characters))
            finish = choice.get("finish_reason") or finish
    return {"sent": sent, "pieces": pieces, "finish": finish, "status": response.status_code}


async def run_streams(url: str, n: int, tokens: int, headers: dict[str, str], tag: str) -> list[dict]:
    async with httpx.AsyncClient(timeout=600, limits=httpx.Limits(max_connections=n + 4)) as client:
        return await asyncio.gather(
            *(stream_chat(client, url, f"Story {tag} {index}.", tokens, headers) for index in range(n))
        )


_requesters: list = []  # the one process the requesters run in, made at the first call


def streams_apart(url: str, n: int, tokens: int, headers: dict[str, str], tag: str) -> list[dict]:
    """run_streams in a process of its own: in this one, the proxy's threads would hold the
    requesters' event loop back (the GIL) and their wait would count as the horde's latency."""
    if not _requesters:
        _requesters.append(multiprocessing.get_context("spawn").Pool(1))
    return _requesters[0].apply(_run_streams, (url, n, tokens, headers, tag))


def _run_streams(url: str, n: int, tokens: int, headers: dict[str, str], tag: str) -> list[dict]:
    return asyncio.run(run_streams(url, n, tokens, headers, tag))


def ms(seconds: float) -> float:
    return round(seconds * 1000, 1)


def rates(streams: list[dict], tokens: int) -> tuple[float, float]:
    total = tokens * len(streams)
    first = min(s["pieces"][0][0] for s in streams)
    last = max(s["pieces"][-1][0] for s in streams)
    sent = min(s["sent"] for s in streams)
    return total / (last - first), total / (last - sent)


def measure(n: int, tokens: int, engine: Engine, stack_url: str, key: str, proxy: TimingProxy) -> dict:
    cpu = [engine.cpu_seconds()]
    direct = streams_apart(f"{proxy.url}/v1/chat/completions", n, tokens, {}, f"d{n}")
    cpu.append(engine.cpu_seconds())
    horde = streams_apart(
        f"{stack_url}/v1/chat/completions", n, tokens, {"Authorization": f"Bearer {key}"}, f"h{n}"
    )
    cpu.append(engine.cpu_seconds())
    for way, streams in (("direct", direct), ("horde", horde)):
        bad = [s for s in streams if s["status"] != 200 or s["finish"] != "length"]
        ended = [(s["status"], s["finish"], len(s["pieces"])) for s in bad]
        assert not bad, f"{way}: streams that did not run to their length: {ended}"
    direct_rate, direct_wall = rates(direct, tokens)
    horde_rate, horde_wall = rates(horde, tokens)
    firsts = {
        "direct": [s["pieces"][0][0] - s["sent"] for s in direct],
        "horde": [s["pieces"][0][0] - s["sent"] for s in horde],
    }
    ttft_direct, ttft_horde = percentile(firsts["direct"], 0.5), percentile(firsts["horde"], 0.5)
    last_direct, last_horde = percentile(firsts["direct"], 0.99), percentile(firsts["horde"], 0.99)
    # At N streams the engine's own queue sets the last first tokens: the horde's p99 over the
    # engine's is what the horde adds beyond it.
    added_p99 = last_horde - last_direct
    # The engine's CPU per token moves from run to run with the host (see `engine_cpu_seconds`),
    # and the last streams' wait with it: the direct p99 scaled by the engine's CPU each way.
    scale = (cpu[2] - cpu[1]) / (cpu[1] - cpu[0])
    added_p99_scaled = last_horde - last_direct * scale
    # Each way's streams, by the last message the proxy keys them by.
    named = {
        way: [(f"Story {tag}{n} {i}.", s) for i, s in enumerate(streams)]
        for way, tag, streams in (("direct", "d", direct), ("horde", "h", horde))
    }
    # Each stream's time outside the engine (its call reaching the proxy, its first token
    # reaching the requester), whatever the engine's queue and rate.
    outside = {way: [_outside_engine(proxy, c, s) for c, s in each] for way, each in named.items()}
    outside_direct, outside_horde = percentile(outside["direct"], 0.99), percentile(outside["horde"], 0.99)
    beyond = {way: _beyond_engine_queue(proxy, each) for way, each in named.items()}
    beyond_direct, beyond_horde = percentile(beyond["direct"], 0.99), percentile(beyond["horde"], 0.99)
    # The engine's own queue each way: from the first stream's first token to the last one's.
    served = {way: [proxy.passed[content][0][0] for content, _ in each] for way, each in named.items()}
    last_token, first_token = [], []
    for content, stream in named["horde"]:
        passed = proxy.passed[content]
        before = 0
        for arrived, characters in stream["pieces"]:
            # The tokens that make up this piece: the first and the last that passed the proxy.
            first = next(t for t, c in passed if c > before)
            last = next(t for t, c in passed if c >= characters)
            first_token.append(arrived - first)
            last_token.append(arrived - last)
            before = characters
    return {
        "streams": n,
        "tokens_per_second": {"direct": round(direct_rate, 1), "horde": round(horde_rate, 1),
                              "ratio": round(horde_rate / direct_rate, 3)},
        "wall_tokens_per_second": {"direct": round(direct_wall, 1), "horde": round(horde_wall, 1),
                                   "ratio": round(horde_wall / direct_wall, 3)},
        # The engine's own CPU each way: the horde taking its core would show as less of it.
        "engine_cpu_seconds": {"direct": round(cpu[1] - cpu[0], 2), "horde": round(cpu[2] - cpu[1], 2)},
        "ttft_ms": {"direct_p50": ms(ttft_direct), "horde_p50": ms(ttft_horde),
                    "added_p50": ms(ttft_horde - ttft_direct), "added_p99": ms(added_p99),
                    "direct_p99": ms(last_direct), "horde_p99": ms(last_horde),
                    "added_p99_at_equal_engine_cpu": ms(added_p99_scaled),
                    "phases_p50": _phases_p50(proxy, named["horde"]),
                    "outside_engine": {"direct_p99": ms(outside_direct),
                                       "horde_p50": ms(percentile(outside["horde"], 0.5)),
                                       "horde_p99": ms(outside_horde),
                                       "added_p99": ms(outside_horde - outside_direct)},
                    "beyond_engine_queue": {"direct_p99": ms(beyond_direct),
                                            "horde_p50": ms(percentile(beyond["horde"], 0.5)),
                                            "horde_p99": ms(beyond_horde),
                                            "added_p99": ms(beyond_horde - beyond_direct),
                                            "engine_queue": {way: ms(max(times) - min(times))
                                                             for way, times in served.items()}}},
        "delta_latency_ms": {"p50": ms(percentile(last_token, 0.5)), "p99": ms(percentile(last_token, 0.99)),
                             "from_first_token_p50": ms(percentile(first_token, 0.5)),
                             "from_first_token_p99": ms(percentile(first_token, 0.99)),
                             "pieces": len(last_token)},
    }  # fmt: skip


def first_tokens(count: int, stack_url: str, key: str, proxy: TimingProxy) -> dict:
    """`count` short chats one at a time, each sent directly and through the horde at a random
    moment (the bridge idle in its waiting pop): the first token's added time, p50 and p99, and
    where it went (p50 of each phase)."""
    added: list[float] = []
    followed: list[tuple[str, dict]] = []
    for index in range(count):
        time.sleep(random.uniform(0.2, 0.6))
        direct = streams_apart(f"{proxy.url}/v1/chat/completions", 1, 8, {}, f"fd{index}")[0]
        time.sleep(random.uniform(0.2, 0.6))
        headers = {"Authorization": f"Bearer {key}"}
        horde = streams_apart(f"{stack_url}/v1/chat/completions", 1, 8, headers, f"fh{index}")[0]
        added.append((horde["pieces"][0][0] - horde["sent"]) - (direct["pieces"][0][0] - direct["sent"]))
        followed.append((f"Story fh{index} 0.", horde))
    return {
        "requests": count,
        "added_ms": {"p50": ms(percentile(added, 0.5)), "p99": ms(percentile(added, 0.99)),
                     "max": ms(max(added))},
        "phases_p50_ms": _phases_p50(proxy, followed),
    }  # fmt: skip


def _phases_p50(proxy: TimingProxy, streams: list[tuple[str, dict]]) -> dict[str, float]:
    """The p50 of each phase (`_phases`) over horde streams, each with its last message."""
    each = [_phases(proxy, content, stream) for content, stream in streams]
    return {name: ms(percentile([phases[name] for phases in each], 0.5)) for name in each[0]}


def _outside_engine(proxy: TimingProxy, content: str, stream: dict) -> float:
    """One stream's time outside the engine, either way: from its send to its chat call
    reaching the proxy, and from its first token passing the proxy to the requester."""
    asked = proxy.arrived[("/v1/chat/completions", content)][0]
    return (asked - stream["sent"]) + (stream["pieces"][0][0] - proxy.passed[content][0][0])


def _beyond_engine_queue(proxy: TimingProxy, streams: list[tuple[str, dict]]) -> list[float]:
    """Each stream's wait for its first token that the engine's queue does not explain, either
    way. The engine serves one stream at a time: a call that reaches it while it serves another
    waits for that one's end, however early it came. What is left is the time the engine stood
    idle for a call that had not reached it yet, up to this stream (each such wait puts off
    every stream after it), and its first token's way from the proxy to the requester."""
    served = sorted(streams, key=lambda item: proxy.passed[item[0]][0][0])
    free_at, idle = 0.0, 0.0
    each = []
    for content, stream in served:
        asked = proxy.arrived[("/v1/chat/completions", content)][0]
        idle += max(0.0, asked - max(stream["sent"], free_at))
        each.append(idle + stream["pieces"][0][0] - proxy.passed[content][0][0])
        free_at = proxy.passed[content][-1][0]
    return each


def _phases(proxy: TimingProxy, content: str, stream: dict) -> dict[str, float]:
    """Where one horde stream's first token waited: the request reaching the bridge (queued,
    popped), the bridge counting the prompt, the engine, the first post and its relay."""
    asked = proxy.arrived[("/v1/chat/completions", content)][0]
    counted = [t for (path, text), times in proxy.arrived.items() if "tokenize" in path and text == content
               for t in times]  # fmt: skip
    reached = min(counted, default=asked)
    first_passed = proxy.passed[content][0][0]
    return {
        "to_bridge": reached - stream["sent"],
        "fit": asked - reached,
        "engine": first_passed - asked,
        "relay": stream["pieces"][0][0] - first_passed,
    }


def disconnect(engine: Engine, stack_url: str, key: str, proxy: TimingProxy) -> dict:
    content = "Story disconnect."
    body = {"model": MODEL, "messages": [{"role": "user", "content": content}], "max_tokens": 1800,
            "temperature": 0, "stream": True}  # fmt: skip
    with httpx.stream(
        "POST", f"{stack_url}/v1/chat/completions", json=body,
        headers={"Authorization": f"Bearer {key}"}, timeout=120,
    ) as response:  # fmt: skip
        pieces = 0
        for line in response.iter_lines():
            pieces += line.startswith("data: {")
            if pieces >= 30:
                break
        closed = time.time()
    # The engine's CPU time every 10 ms for 3 s: generating, it takes a whole core.
    samples = [(closed, engine.cpu_seconds())]
    while samples[-1][0] - closed < 3:
        time.sleep(0.01)
        samples.append((time.time(), engine.cpu_seconds()))
    busy_until = closed
    for index, (at, cpu) in enumerate(samples):
        later = next(((t, c) for t, c in samples[index:] if t - at >= 0.2), None)
        if later is None or (later[1] - cpu) / (later[0] - at) < 0.2:
            busy_until = at
            break
    last_token = proxy.passed[content][-1][0]
    return {
        "pieces_read": pieces,
        "engine_last_token_after_close_ms": ms(max(0.0, last_token - closed)),
        # From the close to the first 200 ms in which the engine used under a fifth of a core.
        "engine_busy_after_close_ms": ms(busy_until - closed),
        "engine_cpu_seconds_in_3s_after_close": round(samples[-1][1] - samples[0][1], 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", default="1,4,16", help="concurrent streams, comma separated")
    parser.add_argument("--tokens", type=int, default=400, help="tokens per reply")
    parser.add_argument("--pop-interval", type=float, default=1.0, help="the bridge's --pop_interval")
    parser.add_argument("--pop-wait", type=float, default=20.0, help="the bridge's --pop_wait (0: it polls)")
    parser.add_argument("--first-tokens", type=int, default=20, help="short chats, one at a time")
    parser.add_argument("--warm", type=int, default=40, help="chats through the horde before measuring")
    args = parser.parse_args()
    sizes = [int(size) for size in args.streams.split(",")]
    if not ENGINE_PYTHON.exists():
        sys.exit("the engine is not installed: run bin/engine-venv")

    env = bench_env(DB_NAME, REDIS_DB, KEY_RATE_PER_SECOND="0", ADDRESS_RATE_PER_SECOND="0")
    prepare_database(DB_NAME, env)
    empty_redis(REDIS_DB)
    rundir = Path(tempfile.mkdtemp(prefix="bench-bridge-"))
    port = free_port()
    processes = start_stack(port, rundir, env, web_workers=2)
    stack_url = f"http://127.0.0.1:{port}"
    engine = Engine(write_model(rundir / f"{MODEL_FILE}.gguf", embedding=512, blocks=6, feed_forward=1536))
    engine.start()
    proxy = TimingProxy(engine.url)
    bridge = None
    try:
        owner = create_account(f"bench-owner-{port}", env)
        requester = create_account(f"bench-requester-{port}", env)
        bridge = start_bridge(
            stack_url, owner, f"bench-bridge-{port}", proxy.url, rundir / "bridge.log",
            "--threads", str(max(sizes)), "--max_length", "2048", "--pop_interval", str(args.pop_interval),
            "--pop_wait", str(args.pop_wait),
        )  # fmt: skip
        # Short streams first: the engine's and the stack's first calls are slow. The stack's
        # pools hand their database connections out in turn, and each connection plans a
        # statement anew until it has run it five times (then it is prepared): --warm chats
        # bring the stack to where a horde in use is.
        streams_apart(f"{proxy.url}/v1/chat/completions", 1, 16, {}, "warm")
        horde = {"Authorization": f"Bearer {requester}"}
        for index in range(args.warm):
            streams_apart(f"{stack_url}/v1/chat/completions", 1, 4, horde, f"w{index}")
        note(f"{args.first_tokens} first tokens")
        first = first_tokens(args.first_tokens, stack_url, requester, proxy)
        results = []
        for n in sizes:
            note(f"{n} streams")
            results.append(measure(n, args.tokens, engine, stack_url, requester, proxy))
        note("disconnect")
        report = {
            "bench": "bridge",
            "python_loop_seconds": python_loop_seconds(),
            "machine": f"{platform.machine()}, {os.cpu_count()} cores",
            "tokens": args.tokens,
            "pop_interval": args.pop_interval,
            "pop_wait": args.pop_wait,
            "warm": args.warm,
            "first_token": first,
            "runs": results,
            "disconnect": disconnect(engine, stack_url, requester, proxy),
        }
        print(json.dumps(report, indent=2))
    except BaseException:
        if (rundir / "bridge.log").exists():
            note(f"--- the bridge's log ---\n{(rundir / 'bridge.log').read_text()[-3000:]}")
        raise
    finally:
        for pool in _requesters:
            pool.terminate()
        terminate([bridge] if bridge else [], timeout=40)
        proxy.stop()
        engine.stop()
        terminate(processes)
        shutil.rmtree(rundir, ignore_errors=True)


if __name__ == "__main__":
    main()
