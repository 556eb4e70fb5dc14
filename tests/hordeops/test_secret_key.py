"""settings.SECRET_KEY: never a public default outside debug."""

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _settings_process(tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    """A new process that loads the settings and prints the key, with `env` for the key's sources."""
    base = {k: v for k, v in os.environ.items() if k not in {"SECRET_KEY", "SECRET_KEY_FILE", "DJANGO_DEBUG"}}
    return subprocess.run(
        [sys.executable, "-c", "from django.conf import settings; print(settings.SECRET_KEY)"],
        cwd=ROOT,
        env={
            **base,
            "DJANGO_SETTINGS_MODULE": "hordeops.settings",
            "SECRET_KEY_FILE": str(tmp_path / "none"),
            **env,
        },
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_without_a_key_or_key_file_the_settings_refuse_to_load(tmp_path):
    result = _settings_process(tmp_path)
    assert result.returncode != 0
    assert "ImproperlyConfigured" in result.stderr and "SECRET_KEY is not set" in result.stderr


def test_a_debug_process_runs_on_a_key_marked_as_not_secret(tmp_path):
    result = _settings_process(tmp_path, DJANGO_DEBUG="true")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "hordeops-development-key-not-secret"


def test_the_key_comes_from_the_variable_before_the_file(tmp_path):
    key_file = tmp_path / "secret_key"
    key_file.write_text("from-the-file\n")
    from_file = _settings_process(tmp_path, SECRET_KEY_FILE=str(key_file))
    assert from_file.stdout.strip() == "from-the-file", from_file.stderr
    from_variable = _settings_process(tmp_path, SECRET_KEY_FILE=str(key_file), SECRET_KEY="from-the-variable")
    assert from_variable.stdout.strip() == "from-the-variable", from_variable.stderr


def test_bin_secret_key_writes_a_private_key_once(tmp_path):
    (tmp_path / "bin").mkdir()
    script = tmp_path / "bin" / "secret-key"
    shutil.copy(ROOT / "bin" / "secret-key", script)
    subprocess.run([str(script)], check=True, capture_output=True, timeout=60)
    key_file = tmp_path / "run" / "secret_key"
    key = key_file.read_text().strip()
    assert len(key) >= 50
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    subprocess.run([str(script)], check=True, capture_output=True, timeout=60)
    assert key_file.read_text().strip() == key  # not rotated on the next start
    assert _settings_process(tmp_path, SECRET_KEY_FILE=str(key_file)).stdout.strip() == key
