"""What an agent's reply costs through the horde: a tool call and a reply held to a JSON schema,
beside a plain reply, each sent to the engine directly and through the horde.

Run:  .venv/bin/python bench/agents.py [--requests 10]

(needs the engine: bin/engine-venv; about two minutes. The JSON goes to stdout, notes to stderr.)

It starts the stack as `bin/stack` does (database hordeops_bench_agents, created and migrated if
missing; Redis database 6), llama.cpp's Python server with its `chatml-function-calling` format
(whose grammars make the tests' tiny random model answer valid tool calls and JSON) and a bridge
in front of it declaring `--tools --structured_outputs` (waiting pops). For each kind, --requests
chats one at a time, not streamed, greedy, each first to the engine and then to the horde:

- `plain`: a reply of 24 tokens;
- `tool_call`: `tools` with one function and `tool_choice` naming it: the reply is its call;
- `json_schema`: `response_format` with a schema: the reply is JSON that fits it.

Printed for each: the reply's tokens (p50), the time direct and through the horde (p50), and
`added_ms`, what the horde added (p50 and max of each request's through-the-horde time less its
direct time). A tool call or a schema costs the horde no more than a plain reply when its
`added_ms` is about the plain one's.
"""

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

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
from tests.bridge.test_agents import CITIES, SCHEMA, TOOLS  # noqa: E402  (the tests' own tool)

DB_NAME = "hordeops_bench_agents"
REDIS_DB = 6
MODEL_FILE = "hordeops-agents"
MODEL = f"openai/{MODEL_FILE}"
KINDS = {
    "plain": {"max_tokens": 24},
    "tool_call": {
        "max_tokens": 48,
        "tools": TOOLS,
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
    },
    "json_schema": {
        "max_tokens": 48,
        "response_format": {"type": "json_schema", "json_schema": {"name": "weather", "schema": SCHEMA}},
    },
}  # fmt: skip


def note(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def chat(client: httpx.Client, url: str, kind: str, index: int, headers: dict[str, str]) -> tuple[float, int]:
    """One chat of `kind`: its time and its reply's tokens; the reply checked for its kind."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": f"Weather {kind} {index}?"}],
            "temperature": 0, **KINDS[kind]}  # fmt: skip
    if kind == "json_schema" and not headers:
        # llama-cpp-python's own form of a schema, as the bridge sends it there.
        body["response_format"] = {"type": "json_object", "schema": SCHEMA}
    started = time.monotonic()
    response = client.post(url, json=body, headers=headers)
    took = time.monotonic() - started
    assert response.status_code == 200, response.text
    answer = response.json()
    message = answer["choices"][0]["message"]
    if kind == "tool_call":
        assert json.loads(message["tool_calls"][0]["function"]["arguments"])["city"] in CITIES, message
    elif kind == "json_schema":
        assert json.loads(message["content"])["city"] in CITIES, message
    return took, answer["usage"]["completion_tokens"]


def measure(kind: str, count: int, engine: Engine, stack_url: str, key: str) -> dict:
    direct, horde, added, tokens = [], [], [], []
    with httpx.Client(timeout=120) as client:
        for index in range(count):
            took_direct, _ = chat(client, f"{engine.url}/v1/chat/completions", kind, index, {})
            took_horde, used = chat(
                client, f"{stack_url}/v1/chat/completions", kind, index, {"Authorization": f"Bearer {key}"}
            )
            direct.append(took_direct)
            horde.append(took_horde)
            added.append(took_horde - took_direct)
            tokens.append(used)
    return {
        "kind": kind,
        "reply_tokens_p50": percentile(tokens, 0.5),
        "direct_ms_p50": round(percentile(direct, 0.5) * 1000, 1),
        "horde_ms_p50": round(percentile(horde, 0.5) * 1000, 1),
        "added_ms": {"p50": round(percentile(added, 0.5) * 1000, 1), "max": round(max(added) * 1000, 1)},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=10, help="chats of each kind")
    args = parser.parse_args()
    if not ENGINE_PYTHON.exists():
        sys.exit("the engine is not installed: run bin/engine-venv")

    env = bench_env(DB_NAME, REDIS_DB, KEY_RATE_PER_SECOND="0", ADDRESS_RATE_PER_SECOND="0")
    prepare_database(DB_NAME, env)
    empty_redis(REDIS_DB)
    rundir = Path(tempfile.mkdtemp(prefix="bench-agents-"))
    port = free_port()
    processes = start_stack(port, rundir, env, web_workers=2)
    stack_url = f"http://127.0.0.1:{port}"
    model = write_model(rundir / f"{MODEL_FILE}.gguf", embedding=512, blocks=6, feed_forward=1536)
    engine = Engine(model, chat_format="chatml-function-calling").start()
    bridge = None
    try:
        owner = create_account(f"bench-owner-{port}", env)
        requester = create_account(f"bench-requester-{port}", env)
        bridge = start_bridge(
            stack_url, owner, f"bench-agents-{port}", engine.url, rundir / "bridge.log",
            "--threads", "1", "--max_length", "256", "--tools", "--structured_outputs",
        )  # fmt: skip
        for kind in KINDS:  # the first calls of each kind are slow, both ways
            measure(kind, 1, engine, stack_url, requester)
        runs = []
        for kind in KINDS:
            note(kind)
            runs.append(measure(kind, args.requests, engine, stack_url, requester))
        print(json.dumps({
            "bench": "agents",
            "python_loop_seconds": python_loop_seconds(),
            "machine": f"{platform.machine()}, {os.cpu_count()} cores",
            "requests": args.requests,
            "runs": runs,
        }, indent=2))  # fmt: skip
    except BaseException:
        if (rundir / "bridge.log").exists():
            note(f"--- the bridge's log ---\n{(rundir / 'bridge.log').read_text()[-3000:]}")
        raise
    finally:
        terminate([bridge] if bridge else [], timeout=40)
        engine.stop()
        terminate(processes)
        shutil.rmtree(rundir, ignore_errors=True)


if __name__ == "__main__":
    main()
