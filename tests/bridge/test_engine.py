"""The tests' engine keeps to the port it is given, whatever the user's shell exports."""

from pathlib import Path

import httpx

from tests.bridge.engine import Engine
from tests.live import free_port


def test_the_engine_serves_on_its_own_port_with_port_and_host_exported(model_file: Path, monkeypatch):
    # bin/stack documents PORT and HOST; llama-cpp-python's server would take them over --port.
    taken = free_port()
    monkeypatch.setenv("PORT", str(taken))
    monkeypatch.setenv("HOST", "127.0.0.2")
    engine = Engine(model_file).start()
    try:
        assert engine.port != taken
        assert httpx.get(f"{engine.url}/v1/models", timeout=5).status_code == 200
    finally:
        engine.stop()
