"""Webhooks on POST /api/v2/generate/text/async (jobs/webhooks.py): the AI Horde's POST after
each done generation, https only, never to a private, loopback or link-local address, three
tries a few seconds apart, off the submit path.

A real local HTTP server receives the hooks. The tries run in this process, as a Celery worker
runs them, from the messages the submit queued (the wait before a retry read from its message's
ETA): a worker of its own would cost each run seconds of start-up for nothing more to see."""

import base64
import datetime
import ipaddress
import json
import logging
import ssl
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
from django.conf import settings as django_settings
from django.db import connections
from django.utils import timezone
from django_redis import get_redis_connection

from hordeops.celery import app
from jobs import webhooks
from jobs.models import Generation, TextRequest
from jobs.tasks import deliver_webhook_task
from tests.hordeops.test_metrics import scrape

PROMPT = "The secret prompt of the requester"
TEXT = "The secret reply of the worker"
AI_HORDE_TEXT_FIELDS = {
    "text",
    "seed",
    "worker_id",
    "worker_name",
    "model",
    "id",
    "state",
    "gen_metadata",
    "request",
    "kudos",
}


class HookServer:
    """A real HTTP server on 127.0.0.1 that records every connection and POST. It answers each
    POST with the next of `statuses` (200 once they run out), after `release` is set."""

    def __init__(self, tls: ssl.SSLContext | None = None) -> None:
        self.calls: list[dict] = []
        self.connections = 0
        self.statuses: list[int] = []
        self.location = ""
        self.release = threading.Event()
        self.release.set()
        self.arrived = threading.Event()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                server.calls.append(
                    {
                        "body": json.loads(raw),
                        "headers": dict(self.headers),
                        "path": self.path,
                        "peer": self.client_address[0],
                        "at": time.monotonic(),
                    }
                )
                server.arrived.set()
                server.release.wait(30)
                status = server.statuses.pop(0) if server.statuses else 200
                self.send_response(status)
                if server.location:
                    self.send_header("Location", server.location)
                # An answer that echoes what it was sent: it must not reach a log either.
                echo = raw[:200]
                self.send_header("Content-Length", str(len(echo)))
                self.end_headers()
                self.wfile.write(echo)

            def log_message(self, *args) -> None:
                pass

        class Server(ThreadingHTTPServer):
            daemon_threads = True

            def verify_request(self, request, client_address) -> bool:
                server.connections += 1
                return True

        self.httpd = Server(("127.0.0.1", 0), Handler)
        if tls is not None:
            self.httpd.socket = tls.wrap_socket(self.httpd.socket, server_side=True)
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    def url(self, host: str = "127.0.0.1", path: str = "/hook", scheme: str = "http") -> str:
        return f"{scheme}://{host}:{self.port}{path}"

    def close(self) -> None:
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def hook():
    server = HookServer()
    yield server
    server.close()


@pytest.fixture
def queue(settings):
    """A webhook queue of this test's own, emptied after it."""
    settings.WEBHOOK_QUEUE = f"test-webhooks-{uuid.uuid4().hex}"
    yield settings.WEBHOOK_QUEUE
    get_redis_connection("default").delete(settings.WEBHOOK_QUEUE, f"_kombu.binding.{settings.WEBHOOK_QUEUE}")


@pytest.fixture
def insecure(settings):
    settings.WEBHOOK_ALLOW_INSECURE = True


def queued(queue: str) -> list[dict]:
    """The tries waiting in `queue`, oldest first: each message's task, arguments and ETA."""
    tries = []
    for raw in reversed(get_redis_connection("default").lrange(queue, 0, -1)):
        message = json.loads(raw)
        args, _, _ = json.loads(base64.b64decode(message["body"]))
        eta = message["headers"]["eta"]
        tries.append(
            {
                "task": message["headers"]["task"],
                "args": args,
                "eta": eta and datetime.datetime.fromisoformat(eta),
            }
        )
    return tries


def run_next(queue: str) -> str:
    """Take the oldest try from `queue` and run it here, as a worker would once its ETA came."""
    raw = get_redis_connection("default").rpop(queue)
    assert raw is not None, "no try is queued"
    args, kwargs, _ = json.loads(base64.b64decode(json.loads(raw)["body"]))
    return deliver_webhook_task.apply(args=args, kwargs=kwargs).get()


def done_generation(requester, owner, webhook: str, capture) -> tuple[str, str]:
    """A request with `webhook`, its generation popped and submitted: their ids."""
    owner.pop("w")
    created = requester.request_text(PROMPT, webhook=webhook)
    assert created.status_code == 202, created.json()
    generation_id = owner.pop("w").json()["id"]
    with capture(execute=True):
        assert owner.submit(generation_id, TEXT, seed=42).status_code == 200
    return created.json()["id"], generation_id


# -- The call ---------------------------------------------------------------------------------


def test_a_done_generation_is_posted_to_its_webhook_with_the_ai_hordes_body(
    requester, owner, hook, queue, insecure, django_capture_on_commit_callbacks
):
    url = hook.url(host="localhost", path="/hook?token=s3cret")
    request_id, generation_id = done_generation(requester, owner, url, django_capture_on_commit_callbacks)
    assert [t["task"] for t in queued(queue)] == [deliver_webhook_task.name]
    assert hook.calls == []  # the submit only queued it

    assert run_next(queue) == "delivered"
    [call] = hook.calls
    generation = Generation.objects.select_related("worker").get(pk=generation_id)
    assert call["body"] == {
        "text": TEXT,
        "seed": 42,
        "worker_id": str(generation.worker_id),
        "worker_name": "w",
        "model": "m1",
        "id": generation_id,
        "state": "ok",
        "gen_metadata": [],
        "request": request_id,
        "kudos": generation.reward,
    }
    assert set(call["body"]) == AI_HORDE_TEXT_FIELDS
    assert call["body"]["kudos"] > 0
    # Sent to the address checked, named as the hook names it.
    assert (call["peer"], call["path"]) == ("127.0.0.1", "/hook?token=s3cret")
    assert call["headers"]["Host"] == f"localhost:{hook.port}"
    assert call["headers"]["Content-Type"] == "application/json"
    assert queued(queue) == []


def test_the_status_route_lists_the_generation_the_webhook_posted(
    requester, owner, hook, queue, insecure, django_capture_on_commit_callbacks
):
    request_id, _ = done_generation(requester, owner, hook.url(), django_capture_on_commit_callbacks)
    run_next(queue)
    [listed] = requester.status(request_id).json()["generations"]
    posted = hook.calls[0]["body"]
    assert listed == {key: posted[key] for key in listed}


def test_a_given_back_generation_posts_nothing(
    requester, owner, hook, queue, insecure, django_capture_on_commit_callbacks
):
    owner.pop("w")
    requester.request_text(PROMPT, webhook=hook.url())
    generation_id = owner.pop("w").json()["id"]
    with django_capture_on_commit_callbacks(execute=True):
        assert owner.submit(generation_id, "", state="faulted").status_code == 200
    assert queued(queue) == []


def test_a_request_without_a_webhook_queues_no_delivery(
    requester, owner, queue, django_capture_on_commit_callbacks
):
    owner.pop("w")
    requester.request_text(PROMPT)
    generation_id = owner.pop("w").json()["id"]
    with django_capture_on_commit_callbacks(execute=True):
        assert owner.submit(generation_id, TEXT).status_code == 200
    assert queued(queue) == []


# -- Tries ------------------------------------------------------------------------------------


def test_a_failing_hook_is_tried_three_times_a_few_seconds_apart(
    requester, owner, hook, queue, insecure, settings, django_capture_on_commit_callbacks
):
    assert settings.WEBHOOK_RETRY_SECONDS == 3.0  # the default
    given_up = ("horde_webhook_deliveries_total", (("outcome", "gave_up"),))
    before = scrape()[given_up]
    hook.statuses = [500, 500, 500, 500]
    _, generation_id = done_generation(requester, owner, hook.url(), django_capture_on_commit_callbacks)
    outcomes = []
    for attempt in (1, 2, 3):
        [waiting] = queued(queue)
        assert waiting["args"] == [generation_id, attempt]
        if attempt == 1:
            assert waiting["eta"] is None
        else:
            wait = (waiting["eta"] - timezone.now()).total_seconds()
            assert 2.5 < wait <= 3.0
        outcomes.append(run_next(queue))
    assert outcomes == ["failed", "failed", "gave_up"]
    assert len(hook.calls) == 3
    assert queued(queue) == []
    assert scrape()[given_up] == before + 1


def test_a_hook_that_answers_on_its_second_try_is_delivered_once(
    requester, owner, hook, queue, insecure, django_capture_on_commit_callbacks
):
    hook.statuses = [503]
    done_generation(requester, owner, hook.url(), django_capture_on_commit_callbacks)
    assert [run_next(queue), run_next(queue)] == ["failed", "delivered"]
    assert len(hook.calls) == 2 and queued(queue) == []


def test_a_redirect_is_not_followed(
    requester, owner, hook, queue, insecure, django_capture_on_commit_callbacks
):
    elsewhere = HookServer()
    try:
        hook.statuses, hook.location = [302], elsewhere.url()
        done_generation(requester, owner, hook.url(), django_capture_on_commit_callbacks)
        assert run_next(queue) == "failed"
        assert len(hook.calls) == 1
        assert elsewhere.connections == 0
    finally:
        elsewhere.close()


def test_a_try_ends_within_the_timeout_whatever_the_hook_does(
    requester, owner, hook, queue, insecure, settings, django_capture_on_commit_callbacks
):
    settings.WEBHOOK_TIMEOUT_SECONDS = 0.5
    hook.release.clear()  # the hook takes the call and never answers
    done_generation(requester, owner, hook.url(), django_capture_on_commit_callbacks)
    started = time.monotonic()
    assert run_next(queue) == "failed"
    assert time.monotonic() - started < 2
    assert len(hook.calls) == 1
    assert [t["args"][1] for t in queued(queue)] == [2]


def test_deliveries_past_WEBHOOK_QUEUE_MAX_are_dropped(
    requester, owner, hook, queue, insecure, settings, django_capture_on_commit_callbacks
):
    settings.WEBHOOK_QUEUE_MAX = 1
    owner.pop("w1")
    owner.pop("w2")
    requester.request_text(PROMPT, webhook=hook.url(), params={"n": 2})
    first, second = owner.pop("w1").json()["id"], owner.pop("w2").json()["id"]
    with django_capture_on_commit_callbacks(execute=True):
        owner.submit(first, TEXT)
        owner.submit(second, TEXT)
    assert [t["args"] for t in queued(queue)] == [[first, 1]]


# -- Refusals as the request is queued ----------------------------------------------------------


def test_a_webhook_that_is_not_https_is_refused_as_the_ai_horde_refuses_it(requester):
    for body in ({}, {"dry_run": True}):
        answer = requester.request_text(PROMPT, webhook="http://93.184.216.34/hook", **body)
        assert answer.status_code == 400
        assert answer.json() == {
            "message": "webhooks need to point to an https endpoint.",
            "rc": "BadRequest",
        }
    assert not TextRequest.objects.exists()


@pytest.mark.parametrize(
    "url",
    [
        "https://localhost/hook",  # a name that resolves to 127.0.0.1
        "https://localhost:8443/hook",
        "https://127.0.0.1/hook",
        "https://127.1/hook",  # written short, resolved to 127.0.0.1
        "https://2130706433/hook",  # 127.0.0.1 as one number
        "https://0x7f.1/hook",
        "https://[::1]/hook",
        "https://[::ffff:127.0.0.1]/hook",
        "https://[64:ff9b::7f00:1]/hook",  # NAT64 of 127.0.0.1
        "https://[2002:a00:1::1]/hook",  # 6to4 of 10.0.0.1
        "https://169.254.169.254/latest/meta-data/",  # a cloud's metadata service
        "https://[fe80::1]/hook",
        "https://10.1.2.3/hook",
        "https://172.16.0.1/hook",
        "https://192.168.1.1/hook",
        "https://100.64.0.1/hook",
        "https://[fd00::1]/hook",
        "https://0.0.0.0/hook",
        "https://224.0.0.1/hook",
        "https://[ff02::1]/hook",
    ],
)
def test_a_webhook_to_a_private_loopback_or_link_local_address_is_refused(requester, url):
    answer = requester.request_text(PROMPT, webhook=url)
    assert answer.status_code == 400
    assert answer.json()["rc"] == "BadRequest"
    assert "private, loopback or link-local" in answer.json()["message"]
    assert not TextRequest.objects.exists()


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("https://hook.invalid/hook", "does not resolve"),
        ("https://user:password@93.184.216.34/hook", "user name or password"),
        ("https:///hook", "names no host"),
        ("not a url", "https"),
        ("ftp://93.184.216.34/hook", "https"),
        ("https://0177.0.0.1/hook", "not a URL"),
    ],
)
def test_a_webhook_that_cannot_be_called_is_refused_with_why(requester, url, says):
    answer = requester.request_text(PROMPT, webhook=url)
    assert answer.status_code == 400
    assert answer.json()["rc"] == "BadRequest" and says in answer.json()["message"]


def test_a_webhook_longer_than_the_ai_hordes_column_is_refused(requester):
    answer = requester.request_text(PROMPT, webhook="https://93.184.216.34/" + "a" * 1003)
    assert answer.status_code == 400 and "webhook" in answer.json()["errors"]


def test_a_public_https_webhook_is_kept_with_its_request(requester):
    for webhook, kept in (
        ("https://93.184.216.34/hook?k=v", "https://93.184.216.34/hook?k=v"),
        ("", ""),
        (None, ""),
    ):
        answer = requester.request_text(PROMPT, webhook=webhook)
        assert answer.status_code == 202
        assert TextRequest.objects.get(pk=answer.json()["id"]).webhook == kept


def test_the_insecure_setting_lets_http_and_private_hooks_through(requester, insecure):
    answer = requester.request_text(PROMPT, webhook="http://localhost:9/hook")
    assert answer.status_code == 202


# -- Refusals at the call ---------------------------------------------------------------------


def test_a_hook_not_allowed_by_the_time_of_the_call_is_not_called(
    requester, owner, hook, queue, settings, django_capture_on_commit_callbacks
):
    # Queued while private addresses were allowed; DNS, or the setting, may change before the
    # call, which checks again.
    settings.WEBHOOK_ALLOW_INSECURE = True
    for url in (hook.url(host="localhost", scheme="https"), hook.url()):
        done_generation(requester, owner, url, django_capture_on_commit_callbacks)
    settings.WEBHOOK_ALLOW_INSECURE = False
    assert [run_next(queue), run_next(queue)] == ["refused", "refused"]
    assert hook.connections == 0
    assert queued(queue) == []  # a refusal is not tried again


def test_the_call_goes_to_the_address_checked_with_the_hooks_name_as_its_host(hook):
    # `.invalid` never resolves: the request can only reach the server through the address given.
    name = httpx.URL(f"http://hook.invalid:{hook.port}/h")
    status = webhooks.post(name, ipaddress.ip_address("127.0.0.1"), {"id": "x"})
    assert status == 200
    assert hook.calls[0]["headers"]["Host"] == f"hook.invalid:{hook.port}"


def test_an_https_hook_is_called_at_the_address_checked_with_its_name_for_tls(tmp_path):
    names = []
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(*_self_signed(tmp_path))
    context.sni_callback = lambda sock, name, ctx: names.append(name)
    server = HookServer(tls=context)
    try:
        name = httpx.URL(f"https://hook.invalid:{server.port}/h")
        with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
            webhooks.post(name, ipaddress.ip_address("127.0.0.1"), {"id": "x"})
        assert names == ["hook.invalid"]  # the name, sent to the address; its certificate checked
        assert server.calls == []
    finally:
        server.close()


def _self_signed(directory: Path) -> tuple[str, str]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "hook.invalid")])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("hook.invalid")]), critical=False)
        .sign(key, hashes.SHA256())
    )
    cert, private = directory / "cert.pem", directory / "key.pem"
    cert.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    private.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return str(cert), str(private)


# -- Logs -------------------------------------------------------------------------------------


def test_no_log_line_carries_the_prompt_the_text_or_the_hooks_path(
    requester, owner, hook, queue, insecure, caplog, django_capture_on_commit_callbacks
):
    caplog.set_level(logging.DEBUG)
    hook.statuses = [500, 500, 500]
    done_generation(requester, owner, hook.url(path="/hook?token=s3cret"), django_capture_on_commit_callbacks)
    assert [run_next(queue) for _ in range(3)] == ["failed", "failed", "gave_up"]
    assert "Webhook of generation" in caplog.text  # the tries are logged...
    for secret in (PROMPT, TEXT, "s3cret"):
        assert secret not in caplog.text  # ...without what they carry


# -- Off the submit path ---------------------------------------------------------------------


def test_a_hanging_hook_slows_no_submit(
    requester, owner, hook, queue, insecure, settings, django_capture_on_commit_callbacks
):
    settings.WEBHOOK_TIMEOUT_SECONDS = 30
    owner.pop("w1")
    owner.pop("w2")
    requester.request_text(PROMPT, webhook=hook.url(), params={"n": 2})
    first, second = owner.pop("w1").json()["id"], owner.pop("w2").json()["id"]
    hook.release.clear()  # the hook takes each call and hangs until released
    with django_capture_on_commit_callbacks(execute=True):
        started = time.monotonic()
        assert owner.submit(first, TEXT).status_code == 200
        assert time.monotonic() - started < 1.5 and hook.calls == []
    # The first delivery runs, as a worker would run it, and hangs on the hook...
    delivering, outcomes = _in_a_thread_on_this_connection(run_next, queue)
    assert hook.arrived.wait(10), "the hook was not called"
    # ...while the next submit is answered at once, its delivery queued behind.
    with django_capture_on_commit_callbacks(execute=True):
        started = time.monotonic()
        assert owner.submit(second, TEXT).status_code == 200
        assert time.monotonic() - started < 1.5
    assert delivering.is_alive() and len(hook.calls) == 1
    hook.release.set()
    delivering.join(10)
    assert outcomes == ["delivered"]
    assert [t["args"] for t in queued(queue)] == [[second, 1]]


def _in_a_thread_on_this_connection(target, *args):
    """Run `target` in a thread of its own on the test's database connection, which sees the
    test's rows (as Django's live server thread shares it): the thread and its results."""
    shared, results = connections["default"], []
    shared.inc_thread_sharing()

    def run() -> None:
        connections["default"] = shared
        try:
            results.append(target(*args))
        finally:
            shared.dec_thread_sharing()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, results


def test_a_plain_celery_worker_takes_the_webhook_queue_beside_the_passes():
    app.loader.import_default_modules()
    queues = app.amqp.queues
    assert {"celery", django_settings.WEBHOOK_QUEUE} <= set(queues)
    # Each its own routing key: a pass published to the default queue is not copied to the hooks'.
    assert queues[django_settings.WEBHOOK_QUEUE].routing_key != queues["celery"].routing_key
