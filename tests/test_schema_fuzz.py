"""schemathesis, from the project's own OpenAPI schema, against a live server: every operation,
a bounded number of examples each, and no 5xx and no answer that breaks the schema.

The checks: no server error (but the deadline's 504, tests/schemathesis.toml), every status and
content type documented, every answer valid against its schema, and every request the schema
allows accepted (`positive_data_acceptance`: the schema offers nothing the server refuses).
`negative_data_rejection` is not run: an over-long field fills the body past 1 MiB, which the
body limit refuses with 413, a status that check does not count as a refusal.

Run more examples with SCHEMATHESIS_EXAMPLES (and another SCHEMATHESIS_SEED) by hand:
`SCHEMATHESIS_EXAMPLES=200 bin/test tests/test_schema_fuzz.py`.
"""

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHECKS = ",".join(
    [
        "not_a_server_error",
        "status_code_conformance",
        "content_type_conformance",
        "response_schema_conformance",
        "positive_data_acceptance",
    ]
)


@pytest.mark.parametrize("live_stack", [1], indirect=True)
def test_every_operation_answers_within_its_schema_and_without_a_server_error(live_stack, make_caller):
    [url] = live_stack.urls
    key = make_caller("schema-fuzzer").api_key
    command = [
        str(ROOT / ".venv" / "bin" / "schemathesis"),
        "--config-file",
        str(ROOT / "tests" / "schemathesis.toml"),
        "run",
        f"{url}/api/schema/",
        "--checks",
        CHECKS,
        "--max-examples",
        os.environ.get("SCHEMATHESIS_EXAMPLES", "25"),
        "--seed",
        os.environ.get("SCHEMATHESIS_SEED", "1"),
        "--workers",
        "1",
        "--request-timeout",
        "20",
        "--no-color",
        # Every route with the fuzzer's key, in each of the headers the routes read it from.
        "--header",
        f"apikey: {key}",
        "--header",
        f"Authorization: Bearer {key}",
        # Pops create chat workers for generated model names, and a chat request for one of them
        # would wait for a worker until the stale pass (not running here) expired it: the
        # deadline ends each such request instead, with the 504 the checks allow.
        "--header",
        "X-MultiLLM-Deadline-Ms: 3000",
    ]
    run = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-20000:] + run.stderr[-5000:]
    assert "Tested: " in run.stdout
