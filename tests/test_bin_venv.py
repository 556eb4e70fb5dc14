"""bin/venv: the stack's virtualenv holds what the stack runs, not the test and bench tools."""

import os
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _imports(python: Path, module: str) -> bool:
    return subprocess.run([str(python), "-c", f"import {module}"], capture_output=True).returncode == 0


def test_the_stacks_virtualenv_has_the_runtime_requirements_only(tmp_path):
    # bin/stack asks for the default set.
    assert re.search(r"^bin/venv$", (ROOT / "bin" / "stack").read_text(), re.MULTILINE)
    venv = tmp_path / "venv"
    env = {**os.environ, "VENV": str(venv)}
    subprocess.run(
        [str(ROOT / "bin" / "venv")], env=env, cwd=ROOT, check=True, capture_output=True, timeout=600
    )
    python = venv / "bin" / "python"
    # hordeops_bridge: a worker runs from the stack's virtualenv too (`.venv/bin/hordeops-bridge`).
    for module in (
        "django",
        "rest_framework",
        "psycopg",
        "celery",
        "gunicorn",
        "uvicorn",
        "redis",
        "hordeops_bridge",
    ):
        assert _imports(python, module), module
    for module in ("pytest", "playwright", "matplotlib", "hypothesis", "openai", "anthropic"):
        assert not _imports(python, module), module
    # Run again, nothing is installed: the stamp says the set is current.
    again = subprocess.run([str(ROOT / "bin" / "venv")], env=env, cwd=ROOT, capture_output=True, timeout=60)
    assert again.returncode == 0 and not again.stdout and not again.stderr
