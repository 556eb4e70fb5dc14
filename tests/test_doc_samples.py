"""Every sample in the README and docs/ works as written.

Each fenced block is taken from the pages themselves, so a sample changed or added is tested
as it now reads:

- `sh` and `python` blocks run against a live server (uvicorn on the test database and Redis),
  page by page, each page in one bash shell as a reader would paste them: exports and
  background jobs carry over from block to block, `python` blocks run in that shell with the
  project's virtualenv. What a reader does by hand, the test does the same way: it puts the
  server's port for `localhost:8000` (and a worker's default `--horde_url`), keeps the
  key `manage.py create_account NAME` prints last as NAMES_KEY (ALICES_KEY, BOBS_KEY), and
  leaves a worker that a block starts last, in the foreground, running there and goes on as
  in another shell (one with commands after it fails: they would never run). A page that
  points the bridge at a model server gets a real one there (llama.cpp's Python server on a
  tiny model), and its `~` is a new directory. A block fails
  on a non-zero status, a Python traceback, an error body (`"error"`, `"rc"`) or, for a
  stream, no `[DONE]`; a page's session fails if a worker it started did not check in.
- The README's `bin/stack` runs as written, on a port of its own and a new database (which it
  creates and migrates, as on a fresh machine) with the test Redis, and the README's next
  commands talk to it.
- The bench commands (minutes each) are checked by their scripts' `--help`: the arguments
  given parse, and every option the block names exists. The few other commands not run here
  are listed in NOT_RUN with the reason.
- A `python` block with `...` lines is an excerpt: its other lines must be the named source
  file's, in order.
- `json` blocks parse; `text` blocks are event streams whose `data:` lines parse and whose
  `event:` names match their data's `type`. `diagram`, `plan` and `log` blocks are figures (the
  architecture's, EXPLAIN output, a program's log), not samples.
"""

import json
import os
import re
import signal
import subprocess
import sys
import uuid
from dataclasses import dataclass

import psycopg
import pytest
from django.conf import settings
from psycopg import sql

from tests.bridge.engine import Engine, write_model
from tests.live import ROOT, LiveStack, database_url, free_port

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
SESSION_TIMEOUT_SECONDS = 240
CHECK_IN_TIMEOUT_SECONDS = 30
STARTUP_TIMEOUT_SECONDS = 60
HOP_SECRET = "a hop secret for the doc samples"

# Commands the docs give that this test does not run, and why.
NOT_RUN = {
    r"bin/test\b": "this test runs under it",
    r"SCREENSHOT_DIR=\S+ bin/test\b": "it runs the browser tests, which make the screenshots",
    # A volunteer's model server: in its place the test serves a tiny model on llama.cpp's
    # Python server, at the address the page gives the bridge (BACKEND_ADDRESS).
    r"llama-server\b": "a model server: the test runs llama.cpp's Python server in its place",
    r"koboldcpp\b": "a model server no registry here ships",
    r"vllm serve\b": "a model server that needs a GPU",
    r"ollama\b": "a model server not installed here",
}
# The whole stack, as the README's first command starts it: on a port of its own, on the test
# database and Redis; a reader waits for its heartbeat, as the test does.
STACK = re.compile(r"^bin/stack\b")
BENCH = re.compile(r"^\.venv/bin/python (?P<script>bench/\w+\.py)(?P<args>[^#]*)(?:#(?P<note>.*))?$")
CREATE_ACCOUNT = re.compile(
    r"^(?P<command>\S*python manage\.py create_account (?P<name>\w+)[^#]*?)\s*(?:#.*)?$"
)
# A worker: the example, or the bridge, started with a worker name.
WORKER = re.compile(r"(examples/chat_worker\.py|bin/hordeops-bridge)\b.* (--worker_name|-n) \S+")
WORKER_NAME = re.compile(r" (?:--worker_name|-n) (\S+)")
# Where the pages' model server listens (llama-server's default): the test's engine answers there.
BACKEND_ADDRESS = "127.0.0.1:8080"
PLACEHOLDER_KEY = re.compile(r"\b[A-Z]+S_KEY\b")
# An excerpt's source, by page (the sentence before the excerpt names it).
EXCERPT_SOURCES = {"docs/reference/worker_protocol.md": ROOT / "bridge" / "hordeops_bridge" / "serve.py"}
# A page that builds on another's set-up says so; its session starts with that block.
PROLOGUES = {"docs/reference/generation_deadline.md": "docs/reference/chat_requests.md"}
# An error body, as JSON or as a Python sample prints a dict.
FAILURE_MARKS = ("Traceback (most recent call last)", '"error"', "'error'", '"rc"', "'rc'", "CommandError",
                 "command not found")  # fmt: skip


@dataclass(frozen=True)
class Sample:
    page: str  # relative to the repository
    line: int
    lang: str
    text: str

    def __str__(self) -> str:
        return f"{self.page}:{self.line}"


def samples() -> list[Sample]:
    found = []
    for page in PAGES:
        content = page.read_text()
        for match in FENCE.finditer(content):
            line = content.count("\n", 0, match.start()) + 1
            found.append(Sample(str(page.relative_to(ROOT)), line, match[1], match[2]))
    return found


def _code(line: str) -> str:
    """A line without its trailing comment (two spaces and a #, as the pages write them)."""
    return line.split("  #")[0].rstrip()


def _on_port(text: str, port: int) -> str:
    """A sample's text with the test server's port for the stack's 8000."""
    return text.replace("localhost:8000", f"127.0.0.1:{port}").replace("127.0.0.1:8000", f"127.0.0.1:{port}")


def _on_database(name: str) -> str:
    """The URL of database `name` on the test database's server."""
    return f"{database_url().rsplit('/', 1)[0]}/{name}"


def _commands(sample: Sample) -> list[str]:
    return [line for line in sample.text.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def _not_run(command: str) -> bool:
    return any(re.match(pattern, command) for pattern in NOT_RUN)


def _is_excerpt(sample: Sample) -> bool:
    return sample.lang == "python" and any(line.strip() == "..." for line in sample.text.splitlines())


def _runs(sample: Sample) -> bool:
    """A block the live sessions run: some command of it is neither a bench nor in NOT_RUN."""
    if sample.lang == "python":
        return not _is_excerpt(sample)
    return sample.lang == "sh" and any(
        not _not_run(command) and not BENCH.match(command) for command in _commands(sample)
    )


def test_every_block_is_run_or_checked() -> None:
    # A block in a language this test does not know would go untested: say how to check it.
    unknown = [f"{sample} ({sample.lang or 'no language'})" for sample in samples()
               if sample.lang not in {"sh", "python", "json", "text", "diagram", "plan", "log"}]  # fmt: skip
    # Each command left out is still in the docs (no exemption outlives its command).
    commands = [command for sample in samples() if sample.lang == "sh" for command in _commands(sample)]
    stale = [pattern for pattern in NOT_RUN if not any(re.match(pattern, command) for command in commands)]
    assert unknown == [] and stale == [], (unknown, stale)
    assert sum(_runs(sample) for sample in samples()) >= 8  # the pages' samples were found


@pytest.mark.parametrize("sample", [s for s in samples() if s.lang == "json"], ids=str)
def test_a_json_sample_parses(sample: Sample) -> None:
    json.loads(sample.text)


@pytest.mark.parametrize("sample", [s for s in samples() if s.lang == "text"], ids=str)
def test_an_event_stream_sample_is_well_formed(sample: Sample) -> None:
    event = None
    data_lines = 0
    for line in sample.text.splitlines():
        if line.startswith("event: "):
            event = line.removeprefix("event: ")
        elif line.startswith("data: "):
            data_lines += 1
            payload = line.removeprefix("data: ")
            if payload != "[DONE]":
                parsed = json.loads(payload)
                if event is not None:
                    assert parsed.get("type") == event, line
            event = None
        else:
            assert line == "", f"neither an event, a data line nor a blank line: {line!r}"
    assert data_lines >= 1


@pytest.mark.parametrize("sample", [s for s in samples() if _is_excerpt(s)], ids=str)
def test_an_excerpt_is_the_source_it_names(sample: Sample) -> None:
    source = [_code(line).strip() for line in EXCERPT_SOURCES[sample.page].read_text().splitlines()]
    lines = [_code(line).strip() for line in sample.text.splitlines() if line.strip()]
    # Each run of lines between `...` is consecutive in the source, the runs in order.
    runs, run = [], []
    for line in lines:
        if line == "...":
            runs, run = runs + [run] if run else runs, []
        else:
            run.append(line)
    runs += [run] if run else []
    at = 0
    for run in runs:
        starts = [i for i in range(at, len(source) - len(run) + 1) if source[i : i + len(run)] == run]
        assert starts, f"not in {EXCERPT_SOURCES[sample.page].name} after line {at}: {run}"
        at = starts[0] + len(run)


def _bench_commands() -> list[tuple[Sample, str]]:
    return [(s, c) for s in samples() if s.lang == "sh" for c in _commands(s) if BENCH.match(c)]


@pytest.mark.parametrize(("sample", "command"), _bench_commands(), ids=lambda v: str(v)[:60])
def test_a_bench_command_parses_and_names_only_options_its_script_has(sample: Sample, command: str) -> None:
    match = BENCH.match(command)
    done = subprocess.run(
        [sys.executable, match["script"], *match["args"].split(), "--help"],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    named = set(re.findall(r"--[a-z][a-z-]*", command))
    assert {option for option in named if option not in done.stdout} == set(), done.stdout


# --- the live sessions -------------------------------------------------------------------


def _shell_line(command: str, port: int, workers: list[str], *, last: bool) -> str:
    """One command as the test pastes it (`last`: the last of its block)."""
    command = _on_port(command, port)
    if _not_run(command) or BENCH.match(command):
        return f": not run here: {command!r}"
    if match := CREATE_ACCOUNT.match(command):
        variable = f"{match['name'].upper()}S_KEY"
        return f'{variable}=$({match["command"]} | tail -n 1); echo "created {match["name"]}"'
    command = PLACEHOLDER_KEY.sub(lambda key: "$" + key[0], command)
    if STACK.match(command):
        # It runs until stopped: "Then, in another shell".
        return (
            f"{_code(command)} 1>&2 &\nBACKGROUND+=($!)\n"
            f"answers 127.0.0.1:{port}/api/v2/status/heartbeat {STARTUP_TIMEOUT_SECONDS}"
        )
    if WORKER.search(command) and "--once" not in command:
        workers.append(WORKER_NAME.search(command)[1])
        in_foreground = not _code(command).endswith("&")
        if in_foreground and not last:
            # The reader's shell would wait on it, and never run the commands after it.
            return f"echo 'a worker in the foreground, with commands after it: {command}'; exit 90"
        # A worker runs until stopped: one started last in the foreground, a reader leaves
        # running in that shell, and goes on in another.
        background = _code(command).removesuffix("&").rstrip()
        if not re.search(r" (-u|--horde_url)\b", background):  # its default is http://127.0.0.1:8000
            background += f" --horde_url http://127.0.0.1:{port}"
        return f"{background} 1>&2 &\nBACKGROUND+=($!)"
    return command


def _script(session: list[Sample], port: int) -> str:
    workers: list[str] = []
    parts = [
        "set -eo pipefail",
        "BACKGROUND=()",
        # Stopped and waited for: bin/stack stops its own processes on TERM (a background job
        # of a script ignores SIGINT, so not as Ctrl-C would).
        "trap 'kill ${BACKGROUND[@]} 2>/dev/null || true; wait' EXIT",
        # answers URL SECONDS: wait until URL answers 2xx, fail if it still does not after SECONDS.
        'answers() { for _ in $(seq $(($2 * 5))); do curl -sf "$1" > /dev/null && return; sleep 0.2; done;'
        ' curl -sf "$1" > /dev/null; }',
    ]
    for index, sample in enumerate(session):
        parts.append(f"printf '\\n@@sample {index}@@\\n'")
        if sample.lang == "python":
            parts.append(f".venv/bin/python - <<'SAMPLE_EOF'\n{_on_port(sample.text, port)}SAMPLE_EOF")
        else:
            # A command may go on over several lines (a trailing backslash): one logical line.
            logical = re.split(r"(?<!\\)\n", sample.text.rstrip("\n"))
            parts.extend(
                _shell_line(line, port, workers, last=at == len(logical) - 1)
                for at, line in enumerate(logical)
            )
    # Each worker a page started must have checked in, and still run, when its samples are done.
    parts.append(f"printf '\\n@@sample {len(session)}@@\\n'")
    parts.extend(
        f"answers 127.0.0.1:{port}/api/v2/workers/name/{name} {CHECK_IN_TIMEOUT_SECONDS}" for name in workers
    )
    parts.append('for pid in "${BACKGROUND[@]}"; do kill -0 "$pid"; done')
    return "\n".join(parts) + "\n"


def _sessions() -> dict[str, list[Sample]]:
    by_page: dict[str, list[Sample]] = {}
    for sample in samples():
        if _runs(sample):
            by_page.setdefault(sample.page, []).append(sample)
    for page, prerequisite in PROLOGUES.items():
        set_up = next(s for s in by_page[prerequisite] if WORKER.search(s.text))
        by_page[page] = [set_up, *by_page[page]]
    return by_page


def _drop_database(name: str) -> None:
    with psycopg.connect(_on_database("postgres"), autocommit=True) as admin:
        admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def _run_session(script: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    # A session of its own: on a timeout, what it left running (a stack, a worker) goes too.
    shell = subprocess.Popen(
        ["bash", "-c", script], cwd=ROOT, env=env, text=True, start_new_session=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        stdout, stderr = shell.communicate(timeout=SESSION_TIMEOUT_SECONDS)
    except subprocess.TimeoutExpired:
        os.killpg(shell.pid, signal.SIGTERM)
        try:
            stdout, stderr = shell.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(shell.pid, signal.SIGKILL)
            stdout, stderr = shell.communicate()
        pytest.fail(f"the session ran over {SESSION_TIMEOUT_SECONDS} s:\n{stdout}\n{stderr}")
    return subprocess.CompletedProcess(shell.args, shell.returncode, stdout, stderr)


@pytest.mark.parametrize("live_stack", [1], indirect=True)
@pytest.mark.live_env(INTERNAL_HOP_SECRET=HOP_SECRET)
@pytest.mark.parametrize("page", sorted(_sessions()))
def test_a_pages_samples_run_as_written_on_a_live_server(
    live_stack: LiveStack, page: str, request: pytest.FixtureRequest, tmp_path
) -> None:
    session = _sessions()[page]
    starts_a_stack = any(STACK.match(command) for sample in session for command in _commands(sample))
    port = free_port() if starts_a_stack else int(live_stack.urls[0].rsplit(":", 1)[1])
    database = database_url()
    if starts_a_stack:
        # As on a fresh machine: bin/stack creates the database it is given, and migrates it.
        name = f"hordeops_docs_{uuid.uuid4().hex[:8]}"
        database = _on_database(name)
        request.addfinalizer(lambda: _drop_database(name))
    env = {
        **{key: value for key, value in os.environ.items() if key != "HORDE_API_KEY"},
        "PORT": str(port),
        "DATABASE_URL": database,
        "REDIS_URL": settings.REDIS_URL,
        "MODERATOR_PASSWORD": "a moderator's long password",
        "INTERNAL_HOP_SECRET": HOP_SECRET,
        "PYTHONUNBUFFERED": "1",
    }
    script = _script(session, port)
    if BACKEND_ADDRESS in script:
        engine = Engine(write_model(tmp_path / "your-model.gguf")).start()
        request.addfinalizer(engine.stop)
        script = script.replace(BACKEND_ADDRESS, engine.url.removeprefix("http://"))
    env["HOME"] = str(tmp_path)  # what a page installs under ~ goes with the test
    done = _run_session(script, env)
    outputs = re.split(r"\n@@sample \d+@@\n", "\n" + done.stdout)[1:]
    assert done.returncode == 0, (
        f"exit {done.returncode} after sample {len(outputs)}:\n{done.stdout}\n{done.stderr}"
    )
    failed = {}
    for sample, output in zip(session, outputs, strict=False):
        marks = [mark for mark in FAILURE_MARKS if mark in output]
        if '"stream": true' in sample.text and "data: [DONE]" not in output:
            marks.append("a stream with no [DONE]")
        if marks:
            failed[str(sample)] = (marks, output[-2000:])
    assert failed == {}, failed
    live_stack.assert_alive()
