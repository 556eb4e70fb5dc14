"""Served over HTTPS behind a TLS-terminating proxy: the settings of the production checklist
(docs/reference/operations.md) make `check --deploy` clean and the admin work through the proxy;
ALLOWED_HOSTS is required to serve outside debug."""

import http.client
import os
import re
import signal
import subprocess
import sys
import time
from urllib.parse import urlencode

import pytest
from django.contrib.auth.models import User

from tests.hordeops.test_keep_alive import ROOT, _free_port
from tests.live import database_url

HOST = "horde.example.org"
# The checklist's settings, as an operator behind a TLS-terminating proxy sets them.
HTTPS_ENV = {
    "ALLOWED_HOSTS": HOST,
    "HTTPS": "true",
    "SECURE_PROXY_SSL_HEADER": "X-Forwarded-Proto",
    "SECURE_HSTS_INCLUDE_SUBDOMAINS": "true",
    "SECURE_HSTS_PRELOAD": "true",
}
UNSET = ("ALLOWED_HOSTS", "DJANGO_DEBUG", *HTTPS_ENV)


def _env(**env: str) -> dict[str, str]:
    return {**{k: v for k, v in os.environ.items() if k not in UNSET}, **env}


def _run(code: list[str], **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *code], cwd=ROOT, env=_env(**env), capture_output=True, text=True, timeout=120
    )


def test_check_deploy_is_clean_with_the_checklists_settings_and_not_without():
    command = ["manage.py", "check", "--deploy", "--fail-level", "WARNING"]
    clean = _run(command, **HTTPS_ENV)
    assert clean.returncode == 0, clean.stdout + clean.stderr
    assert "no issues" in clean.stdout
    bare = _run(command, ALLOWED_HOSTS=HOST)
    assert bare.returncode != 0
    for warning in ("W004", "W008", "W012", "W016"):  # HSTS, redirect, secure cookies
        assert warning in bare.stderr, bare.stderr


def test_the_web_app_refuses_to_load_without_allowed_hosts_outside_debug():
    refused = _run(["-c", "import hordeops.asgi"])
    assert refused.returncode != 0 and "ALLOWED_HOSTS is not set" in refused.stderr
    assert _run(["-c", "import hordeops.asgi"], DJANGO_DEBUG="true").returncode == 0
    assert _run(["-c", "import hordeops.asgi"], ALLOWED_HOSTS=HOST).returncode == 0
    # Commands answer no host: they run without it, as the README's create_account does.
    assert _run(["manage.py", "check"]).returncode == 0


@pytest.fixture
def proxied(settings, db):
    """bin/web with the checklist's settings, as a TLS-terminating proxy would reach it; its port."""
    User.objects.create_user("mia", password="the right horde passphrase", is_staff=True)
    port = _free_port()
    env = _env(PORT=str(port), WEB_WORKERS="1", DATABASE_URL=database_url(), REDIS_URL=settings.REDIS_URL,
               ADDRESS_RATE_PER_SECOND="0", **HTTPS_ENV)  # fmt: skip
    server = subprocess.Popen([str(ROOT / "bin" / "web")], env=env, cwd=ROOT, start_new_session=True)
    try:
        _wait_for(port)
        yield port
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)


def _wait_for(port: int) -> None:
    deadline = time.monotonic() + 30
    while True:
        try:
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            connection.request("GET", "/api/v2/status/heartbeat", headers={"Host": HOST})
            if connection.getresponse().status == 200:
                return
        except OSError:
            assert time.monotonic() < deadline, "bin/web did not come up"
            time.sleep(0.2)


def _through_proxy(port: int, method: str, path: str, body: str | None = None, **headers: str):
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    sent = {"Host": HOST, "X-Forwarded-Proto": "https", **headers}
    if body is not None:
        sent["Content-Type"] = "application/x-www-form-urlencoded"
    connection.request(method, path, body=body, headers=sent)
    answer = connection.getresponse()
    answer.read()
    return answer


@pytest.mark.django_db(transaction=True)
def test_a_moderator_logs_in_through_the_proxy_with_secure_cookies_and_hsts(proxied):
    page = _through_proxy(proxied, "GET", "/admin/login/")
    assert page.status == 200
    assert page.getheader("Strict-Transport-Security") == "max-age=31536000; includeSubDomains; preload"
    cookie = page.getheader("Set-Cookie")
    assert "csrftoken=" in cookie and "Secure" in cookie
    token = re.search(r"csrftoken=([^;]+)", cookie).group(1)
    body = urlencode(
        {"username": "mia", "password": "the right horde passphrase", "csrfmiddlewaretoken": token}
    )
    logged_in = _through_proxy(
        proxied,
        "POST",
        "/admin/login/?next=/admin/",
        body,
        Cookie=f"csrftoken={token}",
        Origin=f"https://{HOST}",
        Referer=f"https://{HOST}/admin/login/",
    )
    assert logged_in.status == 302, logged_in.status  # not 403: the origin is the proxy's https one
    session = logged_in.getheader("Set-Cookie")
    assert "sessionid=" in session and "Secure" in session


@pytest.mark.django_db(transaction=True)
def test_plain_http_is_redirected_but_the_heartbeat_and_metrics_are_not(proxied):
    connection = http.client.HTTPConnection("127.0.0.1", proxied, timeout=10)
    connection.request("GET", "/admin/login/", headers={"Host": HOST})
    answer = connection.getresponse()
    answer.read()
    assert answer.status == 301 and answer.getheader("Location") == f"https://{HOST}/admin/login/"
    for path in ("/api/v2/status/heartbeat", "/metrics"):
        connection.request("GET", path, headers={"Host": HOST})
        answer = connection.getresponse()
        answer.read()
        assert answer.status == 200, path
    connection.request("GET", "/api/v2/status/heartbeat", headers={"Host": "attacker.example"})
    answer = connection.getresponse()
    answer.read()
    assert answer.status == 400  # a host it does not answer to
