"""The bridge's settings, as a volunteer gives them: a flag wins over its environment variable,
which wins over the YAML file, whose AI Horde worker names (`kai_url`, `max_threads`,
`scribe_name`) carry over; a bad setting stops it at once with exit status 2 and says which."""

import json
import re
import subprocess
import threading
from pathlib import Path

import httpx
import pytest

from tests.bridge.conftest import MODEL, sse_data, until

pytestmark = pytest.mark.timeout(240)

SHOW = """
import json, sys
from dataclasses import asdict
from hordeops_bridge.config import load
print(json.dumps(asdict(load(sys.argv[1:]))))
"""


def _loaded(bridge_command: Path, *args: str, env: dict[str, str] | None = None) -> dict:
    """The configuration the installed bridge builds from `args` and `env`."""
    done = subprocess.run(
        [str(bridge_command.parent / "python"), "-c", SHOW, *args],
        env={"PATH": "/usr/bin:/bin", **(env or {})}, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_a_flag_wins_over_the_environment_which_wins_over_the_yaml_file(bridge_command, tmp_path) -> None:
    config = tmp_path / "bridgeData.yaml"
    config.write_text(
        "api_key: from-yaml\nscribe_name: yaml-name\nkai_url: http://127.0.0.1:5001\nmax_threads: 3\n"
        "max_length: 256\nbackend: kobold\n"
    )
    from_file = _loaded(bridge_command, "--config", str(config))
    assert from_file["api_key"] == "from-yaml" and from_file["worker_name"] == "yaml-name"
    assert from_file["backend_url"] == "http://127.0.0.1:5001" and from_file["threads"] == 3
    assert from_file["backend"] == "kobold" and from_file["max_length"] == 256

    env = {"HORDE_CONFIG": str(config), "HORDE_THREADS": "2", "HORDE_WORKER_NAME": "env-name"}
    from_env = _loaded(bridge_command, env=env)
    assert (from_env["threads"], from_env["worker_name"], from_env["api_key"]) == (2, "env-name", "from-yaml")

    from_flags = _loaded(bridge_command, "--threads", "4", "-n", "flag-name", env=env)
    assert (from_flags["threads"], from_flags["worker_name"]) == (4, "flag-name")
    assert from_flags["max_length"] == 256  # what no flag or variable says still comes from the file


def test_the_backend_url_defaults_to_where_each_kind_of_server_listens(bridge_command) -> None:
    assert _loaded(bridge_command, "-a", "k", "-n", "w")["backend_url"] == "http://127.0.0.1:8080"
    kobold = _loaded(bridge_command, "-a", "k", "-n", "w", "--backend", "kobold")
    assert kobold["backend_url"] == "http://127.0.0.1:5001"


def test_tools_and_structured_outputs_are_declared_by_flag_or_environment_and_default_to_off(
    bridge_command, tmp_path
) -> None:
    plain = _loaded(bridge_command, "-a", "k", "-n", "w")
    assert (plain["tools"], plain["structured_outputs"]) == (False, False)
    flags = _loaded(bridge_command, "-a", "k", "-n", "w", "--tools", "--structured_outputs")
    assert (flags["tools"], flags["structured_outputs"]) == (True, True)
    env = _loaded(
        bridge_command, "-a", "k", "-n", "w", env={"HORDE_TOOLS": "yes", "HORDE_STRUCTURED_OUTPUTS": "0"}
    )
    assert (env["tools"], env["structured_outputs"]) == (True, False)
    config = tmp_path / "bridge.yaml"
    config.write_text("api_key: k\nworker_name: w\nstructured_outputs: true\n")
    assert _loaded(bridge_command, "--config", str(config))["structured_outputs"] is True


@pytest.mark.parametrize(
    ("args", "env", "said"),
    [
        (
            ["-a", "k", "-n", "w", "--backend", "kobold", "--tools"],
            {},
            "--tools and --structured_outputs need an OpenAI-compatible backend",
        ),
        ([], {}, "--api_key (or HORDE_API_KEY) is required"),
        (["-a", "k"], {}, "--worker_name (or HORDE_WORKER_NAME) is required"),
        (
            ["-a", "k", "-n", "w", "--backend", "tgi"],
            {},
            "--backend must be one of openai, kobold, not 'tgi'",
        ),
        (["-a", "k", "-n", "w", "--threads", "0"], {}, "--threads must be at least 1"),
        (["-a", "k", "-n", "w"], {"HORDE_THREADS": "many"}, "threads: 'many' is not a valid int"),
        (["-a", "k", "-n", "w", "--config", "/nonexistent.yaml"], {}, "--config /nonexistent.yaml"),
        (
            ["-a", "k", "-n", "w", "--max_length", "4096"],
            {"HORDE_MAX_CONTEXT_LENGTH": "2048"},
            "--max_length must not be more than --max_context_length",
        ),
    ],
)
def test_a_bad_setting_exits_with_status_2_and_names_it(bridge_command, args, env, said) -> None:
    done = subprocess.run(
        [str(bridge_command), *args], env={"PATH": "/usr/bin:/bin", **env},
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2 and said in done.stderr, done.stderr


def test_an_unknown_yaml_option_is_refused_not_ignored(bridge_command, tmp_path) -> None:
    config = tmp_path / "bridge.yaml"
    config.write_text("api_key: k\nworker_name: w\nmax_lenght: 100\n")
    done = subprocess.run(
        [str(bridge_command), "--config", str(config)], env={"PATH": "/usr/bin:/bin"},
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2 and "unknown options max_lenght" in done.stderr


def test_an_ai_horde_worker_yaml_file_alone_serves_jobs_on_two_threads(
    stack, engine, accounts, run_bridge, tmp_path
) -> None:
    config = tmp_path / "bridgeData.yaml"
    config.write_text(
        f"horde_url: {stack.url}\napi_key: {accounts['owner']}\nscribe_name: yaml-bridge\n"
        f"kai_url: {engine.url}\nmax_threads: 2\n"
    )
    bridge = run_bridge("--config", str(config))
    bridge.wait_for(rf"serving {MODEL} as yaml-bridge from {engine.url} \(openai\), 2 threads")
    until(lambda: stack.sql("SELECT threads FROM workers_worker WHERE name = 'yaml-bridge'") == [(2,)])

    # Two requesters at once: the second job is popped while the first is still generating.
    finished: list[int] = []

    def chat() -> None:
        body = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 200}
        with httpx.stream(
            "POST", f"{stack.url}/v1/chat/completions", json={**body, "stream": True},
            headers={"Authorization": f"Bearer {accounts['requester']}"}, timeout=60,
        ) as response:  # fmt: skip
            if any(c["choices"] and c["choices"][0]["finish_reason"] for c in sse_data(response)):
                finished.append(response.status_code)

    threads = [threading.Thread(target=chat) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=90)
    assert finished == [200, 200]
    rows = stack.sql(
        "SELECT g.popped_at, g.finished_at FROM jobs_generation g"
        " JOIN workers_worker w ON w.id = g.worker_id"
        " WHERE w.name = 'yaml-bridge' AND g.state = 'done' ORDER BY g.popped_at"
    )
    assert len(rows) == 2 and rows[1][0] < rows[0][1], rows
    # The bridge logs a submit once the horde has answered it, which may be after the requester
    # has read the stream's end.
    submitted = r"job \S+ \(chat, .*\): submitted, 200 tokens"
    until(lambda: len(re.findall(submitted, bridge.output())) == 2, message="two submits logged")
