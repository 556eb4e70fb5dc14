"""A real OpenID Connect provider for the OAuth sign-in's tests: the small Django project in
tests/oidc_provider (django-oidc-provider), started as its own process on a free port, with its
own SQLite file, one person and one client for the horde. `live_stack` gives its servers the
OAUTH_OIDC_* settings of a test that asks for `oidc_provider` too.
"""

import os
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.live import ROOT, STOP_TIMEOUT_SECONDS, free_port

CLIENT_ID, SECRET = "hordeops-test", "a test client's secret"
USERNAME, PASSWORD = "ada", "ada's password 1815"


class IdentityProvider:
    NAME = "Test ID"

    def __init__(self, workdir: Path) -> None:
        self.database = workdir / "idp.sqlite3"
        self.env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "tests.oidc_provider.settings",
            "OIDC_PROVIDER_DB": str(self.database),
            "PYTHONUNBUFFERED": "1",
        }
        self.process: subprocess.Popen | None = None
        self.log = tempfile.TemporaryFile(mode="w+", encoding="utf-8", errors="replace")
        self.url = ""

    def start(self) -> None:
        subprocess.run(
            [sys.executable, "-m", "tests.oidc_provider.setup", CLIENT_ID, SECRET, "", USERNAME, PASSWORD],
            cwd=ROOT,
            env=self.env,
            check=True,
            capture_output=True,
        )
        port = free_port()
        self.url = f"http://127.0.0.1:{port}/openid"
        self.process = subprocess.Popen(
            [sys.executable, "-m", "django", "runserver", f"127.0.0.1:{port}", "--noreload"],
            cwd=ROOT,
            env=self.env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 30
        while not self._answers():
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the identity provider did not start:\n{self.output()}")
            time.sleep(0.1)

    def _answers(self) -> bool:
        try:
            return httpx.get(f"{self.url}/.well-known/openid-configuration", timeout=2).status_code == 200
        except httpx.TransportError:
            return False

    @property
    def settings(self) -> dict[str, str]:
        """The horde's settings that turn this provider on."""
        return {
            "OAUTH_OIDC_CLIENT_ID": CLIENT_ID,
            "OAUTH_OIDC_SECRET": SECRET,
            "OAUTH_OIDC_SERVER_URL": self.url,
            "OAUTH_OIDC_NAME": self.NAME,
        }

    def allow_redirect(self, uri: str) -> None:
        """Let the client be sent back to `uri` (the horde's callback, known once it listens)."""
        with sqlite3.connect(self.database) as db:
            db.execute(
                "UPDATE oidc_provider_client SET _redirect_uris = ? WHERE client_id = ?", (uri, CLIENT_ID)
            )

    def output(self) -> str:
        self.log.flush()
        self.log.seek(0)
        return self.log.read()[-8000:]

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=STOP_TIMEOUT_SECONDS)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=STOP_TIMEOUT_SECONDS)
        self.log.close()


@pytest.fixture
def oidc_provider(tmp_path: Path) -> Iterator[IdentityProvider]:
    provider = IdentityProvider(tmp_path)
    try:
        provider.start()
        yield provider
    finally:
        provider.stop()
