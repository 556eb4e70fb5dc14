"""A page on another origin uses the horde from a real headless Chromium (Debian's, driven by
Playwright): it queues a horde request and polls it, streams a `/v1/chat/completions` answer
through `fetch`, and reads a refusal. Without CORS every one of these fetches fails."""

import http.server
import threading
import time
from collections.abc import Iterator

import pytest

from tests.front.test_admin_in_a_browser import chromium
from tests.live import Background, ChatWorker, LiveStack, free_port
from workers.services import create_account

pytestmark = pytest.mark.parametrize("live_stack", [1], indirect=True)

MODEL = "koboldcpp/cors-page-8B"
DELTAS = ["Hello ", "from ", "another ", "origin."]
PAGE_HTML = b"<!doctype html><title>A page of another site</title><p>client</p>"

# The page's own script: what KoboldAI Lite and a hosted OpenAI client do with fetch.
SCRIPT = """
async ({base, key, model}) => {
  const out = {};
  const queued = await fetch(base + "/api/v2/generate/text/async", {
    method: "POST",
    headers: {"apikey": key, "content-type": "application/json", "client-agent": "page:1:test"},
    body: JSON.stringify({prompt: "Once upon a time", models: [model], params: {max_length: 16}}),
  });
  out.queued = queued.status;
  const id = (await queued.json()).id;
  let status = {};
  for (let i = 0; i < 300 && !status.done; i++) {
    status = await (await fetch(base + "/api/v2/generate/text/status/" + id)).json();
    if (!status.done) await new Promise((resolve) => setTimeout(resolve, 100));
  }
  out.texts = (status.generations || []).map((g) => g.text);
  const chat = await fetch(base + "/v1/chat/completions", {
    method: "POST",
    headers: {"authorization": "Bearer " + key, "content-type": "application/json",
              "x-multillm-deadline-ms": "30000"},
    body: JSON.stringify({model: model, stream: true, messages: [{role: "user", content: "hi"}]}),
  });
  out.chat = chat.status;
  const reader = chat.body.getReader();
  const decoder = new TextDecoder();
  out.stream = "";
  for (;;) {
    const {done, value} = await reader.read();
    if (done) break;
    out.stream += decoder.decode(value);
  }
  const refused = await fetch(base + "/v1/chat/completions", {
    method: "POST",
    headers: {"authorization": "Bearer not-a-key", "content-type": "application/json"},
    body: "{}",
  });
  out.refused = {status: refused.status, body: await refused.json(),
                 retry: refused.headers.get("x-should-retry")};
  return out;
}
"""


class _Page(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 (the standard library's name)
        self.send_response(200)
        self.send_header("content-type", "text/html")
        self.send_header("content-length", str(len(PAGE_HTML)))
        self.end_headers()
        self.wfile.write(PAGE_HTML)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def other_origin() -> Iterator[str]:
    """A site of its own on another port: another origin than the horde's."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), _Page)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/"
    finally:
        server.shutdown()
        server.server_close()


def _serve(worker: ChatWorker) -> list[int]:
    """Serve the page's two jobs: the horde request whole, the chat reply in pieces."""
    answers = []
    deadline = time.monotonic() + 30
    for _ in range(2):
        while (job := worker.pop())["id"] is None:
            assert time.monotonic() < deadline, "the page queued nothing"
            time.sleep(0.05)
        worker.job, worker.seq = job, 0
        if job.get("kind") == "chat":
            answers += [worker.progress(delta).status_code for delta in DELTAS]
        answers.append(worker.submit("".join(DELTAS)).status_code)
    return answers


def test_a_page_on_another_origin_queues_polls_and_streams_through_fetch(live_stack: LiveStack, other_origin):
    base = live_stack.urls[0]
    _, requester_key = create_account(name="page-user")
    _, worker_key = create_account(name="page-worker-owner")
    worker = ChatWorker(base, worker_key, name="page-worker", model=MODEL)
    assert worker.pop()["id"] is None  # checked in: the chat route knows the model
    serving = Background(_serve, worker)
    with chromium() as page:
        page.goto(other_origin)
        seen = page.evaluate(SCRIPT, {"base": base, "key": requester_key, "model": MODEL})
    assert all(code == 200 for code in serving.result(timeout=60))
    assert (seen["queued"], seen["texts"]) == (202, ["".join(DELTAS)])
    assert seen["chat"] == 200
    pieces = [line for line in seen["stream"].splitlines() if line.startswith("data: ")]
    assert pieces[-1] == "data: [DONE]"
    assert all(delta.strip() in seen["stream"] for delta in DELTAS)
    assert seen["refused"]["status"] == 401
    assert seen["refused"]["body"]["error"]["type"] == "authentication_error"
