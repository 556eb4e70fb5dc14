"""The scripts keep to what they started: none ends processes by name, which would end every
such process on the machine, another stack's or another user's included."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BY_NAME = re.compile(r"\b(pkill|killall)\b")


def _scripts() -> list[Path]:
    found = [path for path in (ROOT / "bin").iterdir() if path.is_file()]
    found += [ROOT / ".ci" / "run", *ROOT.glob("bench/**/*.py"), *ROOT.glob("examples/**/*.py")]
    found += [path for path in ROOT.glob("tests/**/*.py") if path != Path(__file__).resolve()]
    return found


def test_no_script_ends_a_process_by_its_name():
    scripts = _scripts()
    assert ROOT / "bin" / "cluster-tools" in scripts
    offenders = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in scripts
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
        if BY_NAME.search(line)
    ]
    assert offenders == []


def test_the_benchmarks_use_the_servers_the_settings_name_with_databases_of_their_own(monkeypatch):
    from bench.common import bench_env, database_url, redis_url

    monkeypatch.setenv("DATABASE_URL", "postgres://bench@127.0.0.1:6543/hordeops?sslmode=disable")
    monkeypatch.setenv("REDIS_URL", "redis://127.0.0.1:6390/0")
    assert database_url("hordeops_bench") == "postgres://bench@127.0.0.1:6543/hordeops_bench?sslmode=disable"
    assert redis_url(9) == "redis://127.0.0.1:6390/9"
    env = bench_env("hordeops_bench", 7)
    assert (env["DATABASE_URL"], env["REDIS_URL"]) == (database_url("hordeops_bench"), redis_url(7))
