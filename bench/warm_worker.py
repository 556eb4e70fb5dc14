"""The next turn of a conversation on the warm worker: two engines, two bridges, conversations of
several turns over a long history, with the preference on (WARM_WORKER_SECONDS=2) and off (0).

Run:  .venv/bin/python bench/warm_worker.py [--conversations 4] [--turns 10] [--history 2000]

(needs the engine: bin/engine-venv; about ten minutes. The JSON goes to stdout, notes to stderr.)

It starts llama.cpp's Python server twice on the tests' tiny model (512 wide, 6 blocks, a
context of 4,096; one thread each), a proxy in front of each that notes which chats pass it
(`bench/bridge.py` `TimingProxy`), and then, for each setting, the stack as `bin/stack` runs it
(database hordeops_bench_warm, Redis database 8) with one bridge per engine. Each conversation
opens with a system message of about --history tokens and goes on for --turns turns, one at a
time (so the warm worker is free), each a streamed `/v1/chat/completions` of a short reply whose
text the next turn sends back as the assistant's message, as a chat client does.

- `warm_share`: of the follow-up turns, the share served by the engine that served the turn before.
- `ttft_ms`: time to first token of the follow-up turns, p50 and p90, as the requester sees it.
- `prompt_tokens_evaluated`: the tokens the engines read per follow-up turn (their own log,
  "remaining N prompt tokens to eval": llama.cpp reuses the longest common prefix of the
  previous prompt it holds).
"""

import argparse
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.bridge import TimingProxy  # noqa: E402
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

DB_NAME = "hordeops_bench_warm"
REDIS_DB = 8
MODEL_FILE = "hordeops-bench"
MODEL = f"openai/{MODEL_FILE}"
REPLY_TOKENS = 16
EVALUATED = re.compile(r"remaining (\d+) prompt tokens to eval")


def note(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def turn(client: httpx.Client, url: str, key: str, messages: list[dict]) -> tuple[float, str]:
    """One streamed turn: its time to first token and its reply."""
    body = {
        "model": MODEL,
        "messages": messages,
        "max_tokens": REPLY_TOKENS,
        "temperature": 0,
        "stream": True,
    }
    sent = time.monotonic()
    first, reply = None, ""
    with client.stream("POST", url, json=body, headers={"Authorization": f"Bearer {key}"}) as response:
        assert response.status_code == 200, response.read()
        for line in response.iter_lines():
            if not line.startswith("data: {"):
                continue
            choices = json.loads(line[6:]).get("choices") or [{}]
            text = (choices[0].get("delta") or {}).get("content")
            if text:
                first = first or time.monotonic()
                reply += text
    assert first is not None, "a turn with no reply"
    return first - sent, reply


def history(tokens: int, tag: str, engine: Engine) -> str:
    """A story of about `tokens` tokens as `engine` counts them. This model's tokenizer knows only
    bytes, and spells each space as three: several tokens a word, not the horde's four characters
    a token."""
    words = "the king asked the stranger a riddle about the sea and the moon".split()

    def story(length: int) -> str:
        return f"Story {tag}. " + " ".join(words[i % len(words)] for i in range(length))

    counted = len(httpx.post(f"{engine.url}/extras/tokenize", json={"input": story(100)}).json()["tokens"])
    return story(round(100 * tokens / counted))


def evaluated(engines: list[Engine]) -> int:
    return sum(int(n) for engine in engines for n in EVALUATED.findall(engine.output()))


def run_setting(window: str, args, engines: list[Engine], proxies: list[TimingProxy], rundir: Path) -> dict:
    env = bench_env(
        DB_NAME, REDIS_DB, KEY_RATE_PER_SECOND="0", ADDRESS_RATE_PER_SECOND="0", WARM_WORKER_SECONDS=window
    )
    prepare_database(DB_NAME, env)
    empty_redis(REDIS_DB)
    port = free_port()
    processes = start_stack(port, rundir, env, web_workers=2)
    stack_url = f"http://127.0.0.1:{port}"
    bridges: list[subprocess.Popen] = []
    try:
        owner = create_account(f"bench-owner-{port}", env)
        requester = create_account(f"bench-requester-{port}", env)
        for index, proxy in enumerate(proxies):
            bridges.append(start_bridge(
                stack_url, owner, f"bench-warm-{index}-{port}", proxy.url, rundir / f"bridge-{index}.log",
                "--threads", "1", "--max_length", "256", "--max_context_length", "4096",
            ))  # fmt: skip
        url = f"{stack_url}/v1/chat/completions"
        ttfts, warm, follow_ups = [], 0, 0
        before = evaluated(engines)
        with httpx.Client(timeout=300) as client:
            for conversation in range(args.conversations):
                tag = f"{window}-{conversation}"
                messages = [{"role": "system", "content": history(args.history, tag, engines[0])}]
                served_before = None
                for number in range(args.turns):
                    question = f"Turn {number} of {tag}: and then?"
                    messages.append({"role": "user", "content": question})
                    ttft, reply = turn(client, url, requester, messages)
                    messages.append({"role": "assistant", "content": reply})
                    served = next(i for i, proxy in enumerate(proxies) if question in proxy.passed)
                    if served_before is not None:
                        follow_ups += 1
                        warm += served == served_before
                        ttfts.append(ttft)
                    served_before = served
                note(f"window {window}: conversation {conversation} done")
        return {
            "warm_worker_seconds": float(window),
            "follow_up_turns": follow_ups,
            "warm_share": round(warm / follow_ups, 3),
            "ttft_ms": {"p50": round(percentile(ttfts, 0.5) * 1000, 1),
                        "p90": round(percentile(ttfts, 0.9) * 1000, 1)},
            "prompt_tokens_evaluated_per_turn": round(
                (evaluated(engines) - before) / (args.conversations * args.turns), 1
            ),
        }  # fmt: skip
    finally:
        terminate(bridges, timeout=40)
        terminate(processes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--conversations", type=int, default=4)
    parser.add_argument("--turns", type=int, default=10)
    parser.add_argument("--history", type=int, default=2000, help="tokens of the opening history")
    args = parser.parse_args()
    if not ENGINE_PYTHON.exists():
        sys.exit("the engine is not installed: run bin/engine-venv")
    rundir = Path(tempfile.mkdtemp(prefix="bench-warm-"))
    model = write_model(
        rundir / f"{MODEL_FILE}.gguf", embedding=512, blocks=6, feed_forward=1536, context=4096
    )
    engines = [Engine(model, context=4096).start() for _ in range(2)]
    proxies = [TimingProxy(engine.url) for engine in engines]
    try:
        runs = [run_setting(window, args, engines, proxies, rundir) for window in ("2", "0")]
        print(json.dumps({
            "bench": "warm_worker",
            "python_loop_seconds": python_loop_seconds(),
            "machine": f"{platform.machine()}, {os.cpu_count()} cores",
            "conversations": args.conversations, "turns": args.turns, "history_tokens": args.history,
            "runs": runs,
        }, indent=2))  # fmt: skip
    finally:
        for proxy in proxies:
            proxy.stop()
        for engine in engines:
            engine.stop()
        shutil.rmtree(rundir, ignore_errors=True)


if __name__ == "__main__":
    main()
