"""No input makes a horde route answer 500 (docs/reference/horde_api.md).

Every bad input below gets a 4xx whose body is JSON in the horde's error shape,
`{"message": ..., "rc": ...}`, with the exact status and code. Where a request reached a job,
the job is not lost: a queued request can still be popped and a popped generation is still
processing and can still be submitted once.
"""

import asyncio
import json
import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from asgiref.sync import async_to_sync

from jobs.models import Generation, TextRequest
from tests.conftest import Caller
from workers.models import Worker

ASYNC = "/api/v2/generate/text/async"
POP = "/api/v2/generate/text/pop"
SUBMIT = "/api/v2/generate/text/submit"
STATUS = "/api/v2/generate/text/status/"
HEARTBEAT = "/api/v2/status/heartbeat"
MIB = 1024 * 1024
PROMPT = "Once upon a time"
ROUTES = ("async", "pop", "submit")
SUCCESS = {"async": 202, "pop": 200, "submit": 200}


# --- Helpers -------------------------------------------------------------------------------------


def assert_refused(response, status: int, rc: str) -> dict:
    """The response is `status` with a JSON horde error body whose code is `rc`."""
    assert response.status_code == status, response.content[:500]
    assert response["Content-Type"].split(";")[0] == "application/json"
    body = json.loads(response.content)
    assert isinstance(body, dict)
    assert body["rc"] == rc, body
    assert isinstance(body["message"], str)
    assert body["message"]
    return body


def assert_names_field(body: dict, field: str) -> None:
    """A ValidationError body has an `errors` object that names `field` (dotted path)."""
    assert isinstance(body["errors"], dict)
    assert body["errors"]
    assert any(key == field or key.startswith(f"{field}.") for key in body["errors"]), body["errors"]


def place(body: dict, field: str, value: Any) -> dict:
    """Set a dotted `field` ("params.temperature") in a copy of `body`."""
    body = json.loads(json.dumps(body))
    *parents, leaf = field.split(".")
    target = body
    for parent in parents:
        target = target.setdefault(parent, {})
    target[leaf] = value
    return body


def short(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value)
    return text if len(text) <= 24 else f"{text[:12]}...({len(text)})"


def case_ids(cases: list[tuple]) -> list[str]:
    return [f"{route}-{field}={short(value)}" for route, field, value in cases]


def assert_still_queued(request_id: str) -> None:
    text_request = TextRequest.objects.get(pk=request_id)
    assert text_request.state == TextRequest.State.ACTIVE
    assert text_request.queued == 1
    assert not text_request.generations.exists()


def assert_still_processing(request_id: str, generation_id: str) -> None:
    generation = Generation.objects.get(pk=generation_id)
    assert generation.state == Generation.State.PROCESSING
    assert generation.text is None
    text_request = TextRequest.objects.get(pk=request_id)
    assert text_request.state == TextRequest.State.ACTIVE
    assert (text_request.queued, text_request.finished, text_request.restarts) == (0, 0, 0)


@dataclass
class Scene:
    """One horde POST route, a caller allowed to use it, a valid body, and the job it can reach."""

    route: str
    path: str
    caller: Caller
    body: dict
    assert_kept: Callable[[], None]

    def send(self, body: Any, **headers: str):
        return self.caller.post(self.path, body, **headers)

    def send_raw(self, raw: bytes, content_type: str = "application/json", **extra: str):
        extra.setdefault("HTTP_APIKEY", self.caller.api_key)
        return self.caller.client.generic("POST", self.path, raw, content_type=content_type, **extra)

    def raw_with(self, placeholder_field: str, raw_value: str) -> bytes:
        """The valid body with one field's JSON text replaced by `raw_value`, verbatim."""
        text = json.dumps(place(self.body, placeholder_field, "@@RAW@@"))
        return text.replace('"@@RAW@@"', raw_value).encode()


def _scene(route: str, requester: Caller, owner: Caller) -> Scene:
    owner.pop("worker-1")  # the worker announces model m1
    if route == "async":

        def no_request_created() -> None:
            assert not TextRequest.objects.exists()

        return Scene(route, ASYNC, requester, {"prompt": PROMPT}, no_request_created)

    request_id = requester.request_text(models=["m1"]).json()["id"]
    if route == "pop":

        def still_poppable() -> None:
            assert_still_queued(request_id)
            assert owner.pop("worker-1").json()["id"] is not None

        return Scene(route, POP, owner, {"name": "worker-1", "models": ["m1"]}, still_poppable)

    generation_id = owner.pop("worker-1").json()["id"]

    def still_submittable() -> None:
        assert_still_processing(request_id, generation_id)
        assert owner.submit(generation_id).status_code == 200
        assert_refused(owner.submit(generation_id), 400, "DuplicateGen")

    return Scene(route, SUBMIT, owner, {"id": generation_id, "generation": "The end."}, still_submittable)


@pytest.fixture(params=ROUTES)
def scene(request, requester, owner) -> Scene:
    return _scene(request.param, requester, owner)


@dataclass
class Popped:
    request_id: str
    generation_id: str


@pytest.fixture
def popped(requester, owner) -> Popped:
    owner.pop("worker-1")
    request_id = requester.request_text(models=["m1"]).json()["id"]
    generation_id = owner.pop("worker-1").json()["id"]
    assert generation_id
    return Popped(request_id, generation_id)


def asgi_post(path: str, chunks: list[bytes], headers: list[tuple[bytes, bytes]]) -> tuple[int, bytes]:
    """POST through the ASGI application itself, as uvicorn would, body in `chunks`.

    Unlike the test client, this can send a body without a Content-Length (chunked).
    """
    from hordeops.asgi import application

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "headers": [(b"host", b"testserver"), *headers],
        "server": ("testserver", 80),
        "client": ("127.0.0.1", 40000),
    }
    messages = [
        {"type": "http.request", "body": chunk, "more_body": index < len(chunks) - 1}
        for index, chunk in enumerate(chunks)
    ]
    sent: list[dict] = []

    async def receive() -> dict:
        if messages:
            return messages.pop(0)
        await asyncio.Future()  # the client stays connected

    async def send(message: dict) -> None:
        sent.append(message)

    # The request signals run on the app's sync thread, against that thread's connection:
    # the test's own transaction is not touched.
    async_to_sync(application)(scope, receive, send)
    start = next(message for message in sent if message["type"] == "http.response.start")
    body = b"".join(message.get("body", b"") for message in sent if message["type"] == "http.response.body")
    return start["status"], body


def chunked(raw: bytes, size: int = 64 * 1024) -> list[bytes]:
    return [raw[index : index + size] for index in range(0, len(raw), size)] or [b""]


# --- Wrong types ---------------------------------------------------------------------------------

NOT_A_STRING = [1, 0, -1, 1.5, True, False, None, [], ["x"], {}, {"a": "b"}]
NOT_AN_INT = ["1", "x", "", 1.5, 1.0, True, False, None, [], [1], {}, {"a": 1}]
NOT_A_FLOAT = ["0.5", "x", "", True, False, None, [], [0.5], {}, {"a": 0.5}]
NOT_A_BOOL = ["true", "false", "", 1, 0, 1.0, None, [], [True], {}, {"a": True}]
NOT_A_LIST = ["m1", "", 1, 0, 1.5, True, False, None, {}, {"0": "m1"}]
NOT_AN_OBJECT = [[], [{"n": 1}], "x", "", 1, 1.5, True, None]
NOT_A_STRING_LIST = [*NOT_A_LIST, [1], [None], [True], [1.5], [[]], [{}], [["m1"]]]
NOT_A_UUID = [
    1,
    0,
    -1,
    True,
    False,
    1.5,
    None,
    [],
    {},
    ["00000000-0000-0000-0000-000000000001"],
    "xyz",
    "1",
    "",
    "a" * 37,
    "%00",
    "00000000-0000-0000-0000-00000000000g",
    "00000000-0000-0000-0000-0000000000001",
    "3f2b8c1e-6a4d-4e2b-9c7a-1d5e8f0a2b3",
]

PARAM_INTS = ("n", "max_length", "max_context_length", "rep_pen_range", "top_k")
PARAM_FLOATS = (
    "rep_pen",
    "rep_pen_slope",
    "temperature",
    "tfs",
    "top_a",
    "top_p",
    "typical",
    "min_p",
    "smoothing_factor",
    "dynatemp_range",
    "dynatemp_exponent",
)
PARAM_FLAGS = (
    "use_default_badwordsids",
    "frmtadsnsp",
    "frmtrmblln",
    "frmtrmspch",
    "frmttriminc",
    "singleline",
)

WRONG_TYPES: list[tuple[str, str, Any]] = [
    *[("async", "prompt", v) for v in NOT_A_STRING],
    *[("async", "params", v) for v in NOT_AN_OBJECT],
    *[("async", "models", v) for v in NOT_A_STRING_LIST],
    *[("async", "workers", v) for v in NOT_A_LIST],
    *[("async", "workers", [v]) for v in NOT_A_UUID if not isinstance(v, list)],
    *[("async", flag, v) for flag in ("trusted_workers", "slow_workers", "dry_run") for v in NOT_A_BOOL],
    *[("async", f"params.{name}", v) for name in PARAM_INTS for v in NOT_AN_INT],
    *[("async", f"params.{name}", v) for name in PARAM_FLOATS for v in NOT_A_FLOAT],
    *[("async", f"params.{name}", v) for name in PARAM_FLAGS for v in NOT_A_BOOL],
    *[("async", "params.sampler_order", v) for v in NOT_A_LIST],
    *[("async", "params.sampler_order", v) for v in (["0", "1", "2", "3", "4", "5", "6"], [0.0] * 7)],
    *[("async", "params.stop_sequence", v) for v in NOT_A_STRING_LIST],
    *[("pop", "name", v) for v in NOT_A_STRING],
    *[("pop", "models", v) for v in NOT_A_STRING_LIST],
    *[
        ("pop", field, v)
        for field in ("max_length", "max_context_length", "threads", "amount")
        for v in NOT_AN_INT
    ],
    *[("pop", flag, v) for flag in ("nsfw", "chat") for v in NOT_A_BOOL],
    *[("pop", "bridge_agent", v) for v in NOT_A_STRING],
    *[("submit", "id", v) for v in NOT_A_UUID],
    *[("submit", "generation", v) for v in NOT_A_STRING],
    *[("submit", "state", v) for v in (1, 0, True, None, [], {}, ["ok"], {"ok": 1}, "OK", "done", "")],
    *[("submit", "seed", v) for v in NOT_AN_INT],
    *[("submit", "gen_metadata", v) for v in (*NOT_A_LIST, [[]], ["x"], [1], [None], [True], [[{}]])],
]


@pytest.mark.parametrize(
    ("scene", "field", "value"),
    WRONG_TYPES,
    ids=case_ids(WRONG_TYPES),
    indirect=["scene"],
)
def test_a_wrong_type_for_any_field_is_refused_with_ValidationError(scene, field, value):
    body = assert_refused(scene.send(place(scene.body, field, value)), 400, "ValidationError")
    assert body["message"] == "Input payload validation failed"
    assert_names_field(body, field)
    scene.assert_kept()


# --- Negative and huge numbers -------------------------------------------------------------------

HUGE = [10**30, -(10**30), 2**63, 2**64, -(2**64), 10**400, 1e308, -1e308]
OUT_OF_RANGE: list[tuple[str, str, Any]] = [
    *[("async", "params.n", v) for v in (0, -1, 21, *HUGE)],
    *[("async", "params.max_length", v) for v in (15, -1, 16385, *HUGE)],
    *[("async", "params.max_context_length", v) for v in (79, -1, 1048577, *HUGE)],
    *[("async", "params.rep_pen_range", v) for v in (-1, 4097, *HUGE)],
    *[("async", "params.top_k", v) for v in (-1, 201, *HUGE)],
    *[("async", "params.temperature", v) for v in (-1, -0.001, 5.001, *HUGE, 1e-308 * -1)],
    *[("async", "params.top_p", v) for v in (0, -1, 1.001, *HUGE)],
    *[("async", "params.rep_pen", v) for v in (0.999, -1, 3.001, *HUGE)],
    *[("async", "params.min_p", v) for v in (-1, 1.001, *HUGE)],
    *[("async", "params.sampler_order", v) for v in ([-1, 1, 2, 3, 4, 5, 6], [0, 1, 2, 3, 4, 5, 10**30])],
    *[("pop", field, v) for field in ("max_length", "max_context_length") for v in (0, -1, 1048577, *HUGE)],
    *[("pop", "threads", v) for v in (0, -1, 51, *HUGE)],
    *[("pop", "amount", v) for v in (0, -1, 21, *HUGE)],
    *[("submit", "seed", v) for v in (2**63, -(2**63) - 1, *HUGE)],
]


@pytest.mark.parametrize(
    ("scene", "field", "value"),
    OUT_OF_RANGE,
    ids=case_ids(OUT_OF_RANGE),
    indirect=["scene"],
)
def test_a_negative_or_huge_number_is_refused_with_ValidationError(scene, field, value):
    body = assert_refused(scene.send(place(scene.body, field, value)), 400, "ValidationError")
    assert_names_field(body, field)
    scene.assert_kept()


@pytest.mark.parametrize("seed", [-1, -(2**63), 2**63 - 1])
def test_a_negative_or_64_bit_seed_is_accepted(owner, popped, seed):
    assert owner.submit(popped.generation_id, seed=seed).status_code == 200
    assert Generation.objects.get(pk=popped.generation_id).seed == seed


def test_huge_but_finite_numbers_in_gen_metadata_are_stored(owner, popped):
    metadata = [
        {"type": "n", "value": 10**30, "ref": -(10**30)},
        {"type": "f", "value": 1e308, "ref": -1e308},
    ]
    assert owner.submit(popped.generation_id, gen_metadata=metadata).status_code == 200
    stored = Generation.objects.get(pk=popped.generation_id).gen_metadata
    assert stored[0] == metadata[0]
    # JSONB keeps numbers as numeric: 1e308 comes back as the integer it equals in decimal.
    assert [float(stored[1]["value"]), float(stored[1]["ref"])] == [1e308, -1e308]


NON_FINITE = ["NaN", "-NaN", "Infinity", "-Infinity", "1e309", "-1e309", "1" + "0" * 5000]
NON_FINITE_PLACES = {
    "async": ["params.temperature", "params.max_length", "unknown"],
    "pop": ["max_length", "threads", "unknown"],
    "submit": ["seed", "gen_metadata", "unknown"],
}
NON_FINITE_CASES = [
    (route, field, raw)
    for route, fields in NON_FINITE_PLACES.items()
    for field in fields
    for raw in NON_FINITE
]


@pytest.mark.parametrize(
    ("scene", "field", "raw"),
    NON_FINITE_CASES,
    ids=case_ids(NON_FINITE_CASES),
    indirect=["scene"],
)
def test_NaN_Infinity_and_unrepresentable_numbers_are_refused_with_InvalidJSON(scene, field, raw):
    if field == "gen_metadata":
        raw = f'[{{"type": "x", "value": {raw}}}]'
    assert_refused(scene.send_raw(scene.raw_with(field, raw)), 400, "InvalidJSON")
    scene.assert_kept()


@pytest.mark.parametrize("raw", ["NaN", "Infinity", "-Infinity", "1e309"])
def test_a_top_level_NaN_or_Infinity_is_refused_with_InvalidJSON(scene, raw):
    assert_refused(scene.send_raw(raw.encode()), 400, "InvalidJSON")
    scene.assert_kept()


# --- Ids -----------------------------------------------------------------------------------------

MALFORMED_IDS = ["xyz", "1", "a" * 37, "%00", "", "00000000-0000-0000-0000-00000000000g", 1, True, None]


@pytest.mark.parametrize("bad_id", MALFORMED_IDS, ids=[short(v) for v in MALFORMED_IDS])
def test_a_malformed_generation_id_on_submit_is_refused_with_ValidationError(owner, popped, bad_id):
    body = assert_refused(owner.post(SUBMIT, {"id": bad_id, "generation": "x"}), 400, "ValidationError")
    assert_names_field(body, "id")
    assert_still_processing(popped.request_id, popped.generation_id)


@pytest.mark.parametrize(
    "unknown_id",
    [uuid.uuid4(), uuid.UUID(int=0), uuid.UUID(int=2**128 - 1)],
    ids=["random", "nil", "max"],
)
def test_an_unknown_generation_id_on_submit_is_refused_with_InvalidJobID(owner, popped, unknown_id):
    assert_refused(owner.submit(unknown_id), 404, "InvalidJobID")
    assert_still_processing(popped.request_id, popped.generation_id)


BAD_STATUS_IDS = [
    "xyz",
    "1",
    "-1",
    "null",
    "a" * 37,
    "%00",
    "%ff",
    "%20",
    "",
    "0" * 36,
    "9" * 40,
    "00000000-0000-0000-0000-00000000000g",
    "3F2B8C1E-6A4D-4E2B-9C7A-1D5E8F0A2B3C",
    "{3f2b8c1e-6a4d-4e2b-9c7a-1d5e8f0a2b3c}",
    "3f2b8c1e-6a4d-4e2b-9c7a-1d5e8f0a2b3c0",
    "3f2b8c1e-6a4d-4e2b-9c7a-1d5e8f0a2b3c",  # well formed, unknown
]


@pytest.mark.parametrize("method", ["get", "delete"])
@pytest.mark.parametrize("bad_id", BAD_STATUS_IDS)
def test_a_malformed_or_unknown_status_id_is_refused_with_RequestNotFound(requester, owner, method, bad_id):
    owner.pop("worker-1")
    request_id = requester.request_text(models=["m1"]).json()["id"]
    response = getattr(requester.client, method)(STATUS + bad_id)
    assert_refused(response, 404, "RequestNotFound")
    assert_still_queued(request_id)


@pytest.mark.parametrize("method", ["get", "delete"])
@pytest.mark.parametrize("path", ["a/b", "%2F", "x/"])
def test_a_status_path_with_a_slash_in_the_id_is_refused_with_NotFound(client, method, path):
    assert_refused(getattr(client, method)(STATUS + path), 404, "NotFound")


# --- NUL bytes -----------------------------------------------------------------------------------

NUL_PLACES = {
    "async": ["prompt", "models", "params.stop_sequence", "key", "params.key", "unknown"],
    "pop": ["name", "models", "bridge_agent", "key", "unknown"],
    "submit": ["id", "generation", "gen_metadata", "gen_metadata.key", "key", "unknown"],
}
NUL_CASES = [(route, where) for route, places in NUL_PLACES.items() for where in places]


def _with_escaped_nul(scene: Scene, where: str) -> bytes:
    body = json.loads(json.dumps(scene.body))
    nul = "a\u0000b"
    if where == "key":
        body[nul] = 1
    elif where == "params.key":
        body["params"] = {nul: 1}
    elif where == "gen_metadata.key":
        body["gen_metadata"] = [{nul: "x"}]
    elif where == "gen_metadata":
        body["gen_metadata"] = [{"type": "x", "value": nul}]
    elif where in ("models", "params.stop_sequence"):
        body = place(body, where, ["m1", nul])
    else:
        body = place(body, where, nul)
    raw = json.dumps(body).encode()
    assert b"\\u0000" in raw
    assert b"\x00" not in raw
    return raw


@pytest.mark.parametrize(
    ("scene", "where"),
    NUL_CASES,
    ids=[f"{route}-{where}" for route, where in NUL_CASES],
    indirect=["scene"],
)
def test_an_escaped_nul_in_a_string_or_key_is_refused_with_NulByteInPayload(scene, where):
    assert_refused(scene.send_raw(_with_escaped_nul(scene, where)), 400, "NulByteInPayload")
    scene.assert_kept()


RAW_NUL_BODIES = {
    "inside-a-string": lambda scene: json.dumps(scene.body).replace('": "', '": "a\x00', 1).encode(),
    "after-the-body": lambda scene: json.dumps(scene.body).encode() + b"\x00",
    "before-the-body": lambda scene: b"\x00" + json.dumps(scene.body).encode(),
    "alone": lambda scene: b"\x00",
    "utf16": lambda scene: json.dumps(scene.body).encode("utf-16-le"),
}


@pytest.mark.parametrize("where", RAW_NUL_BODIES)
def test_a_raw_nul_byte_in_the_body_is_refused_with_NulByteInPayload(scene, where):
    raw = RAW_NUL_BODIES[where](scene)
    assert b"\x00" in raw
    assert_refused(scene.send_raw(raw), 400, "NulByteInPayload")
    scene.assert_kept()


def test_a_nul_byte_in_a_prompt_is_refused_with_NulByteInPayload(requester):
    assert_refused(requester.request_text("Once\u0000upon"), 400, "NulByteInPayload")
    assert not TextRequest.objects.exists()


# --- Invalid UTF-8 and Unicode -------------------------------------------------------------------

INVALID_UTF8 = {
    "lone-continuation": b"\x80",
    "ff": b"\xff",
    "truncated-sequence": b"\xc3",
    "bad-continuation": b"\xc3\x28",
    "overlong-slash": b"\xc0\xaf",
    "encoded-surrogate": b"\xed\xa0\x80",
    "above-u10ffff": b"\xf4\x90\x80\x80",
    "latin-1": b"caf\xe9",
}


@pytest.mark.parametrize("sequence", INVALID_UTF8)
def test_an_invalid_utf8_body_is_refused_with_InvalidJSON(scene, sequence):
    text = json.dumps(place(scene.body, "unknown", "@@BYTES@@")).encode()
    raw = text.replace(b"@@BYTES@@", INVALID_UTF8[sequence])
    assert_refused(scene.send_raw(raw), 400, "InvalidJSON")
    scene.assert_kept()


def test_a_latin_1_body_is_refused_with_InvalidJSON_even_when_declared(scene):
    raw = json.dumps(place(scene.body, "unknown", "café"), ensure_ascii=False).encode("latin-1")
    response = scene.send_raw(raw, content_type="application/json; charset=latin-1")
    assert_refused(response, 400, "InvalidJSON")
    scene.assert_kept()


SURROGATE_PLACES = {
    "async": ["prompt", "models", "params.stop_sequence", "key"],
    "pop": ["name", "models", "key"],
    "submit": ["generation", "gen_metadata", "gen_metadata.key", "key"],
}
SURROGATE_CASES = [
    (route, where, surrogate)
    for route, places in SURROGATE_PLACES.items()
    for where in places
    for surrogate in ("\\ud800", "\\udfff", "x\\ud83d")
]


@pytest.mark.parametrize(
    ("scene", "where", "surrogate"),
    SURROGATE_CASES,
    ids=[f"{route}-{where}-{surrogate}" for route, where, surrogate in SURROGATE_CASES],
    indirect=["scene"],
)
def test_an_escaped_lone_surrogate_is_refused_with_InvalidJSON(scene, where, surrogate):
    raw = _with_escaped_nul(scene, where).replace(b"a\\u0000b", surrogate.encode())
    assert_refused(scene.send_raw(raw), 400, "InvalidJSON")
    scene.assert_kept()


def test_an_escaped_surrogate_pair_is_a_valid_character(requester, owner):
    owner.pop("worker-1")
    raw = b'{"prompt": "smile \\ud83d\\ude00", "models": ["m1"]}'
    response = requester.client.generic(
        "POST", ASYNC, raw, content_type="application/json", HTTP_APIKEY=requester.api_key
    )
    assert response.status_code == 202
    assert TextRequest.objects.get().prompt == "smile \U0001f600"


# --- Invalid JSON and non-object bodies ----------------------------------------------------------

INVALID_JSON = {
    "open-brace": b"{",
    "missing-value": b'{"prompt": }',
    "single-quotes": b"{'prompt': 'x'}",
    "trailing-comma": b'{"prompt": "x",}',
    "two-documents": b'{"prompt": "x"}{"prompt": "y"}',
    "missing-comma": b'{"prompt": "x" "models": []}',
    "unterminated-string": b'{"prompt": "x}',
    "bare-word": b"undefined",
    "misspelt-literal": b'{"dry_run": tru}',
    "comment": b'{"prompt": "x"} // hi',
    "utf8-bom": b'\xef\xbb\xbf{"prompt": "x"}',
    "hex-number": b'{"seed": 0x10}',
    "leading-zero": b'{"seed": 01}',
    "unescaped-control": b'{"prompt": "a\x01b"}',
    "bad-escape": b'{"prompt": "\\x41"}',
    "short-unicode-escape": b'{"prompt": "\\u12"}',
    "unclosed-list": b"[1, 2",
}


@pytest.mark.parametrize("kind", INVALID_JSON)
def test_invalid_json_is_refused_with_InvalidJSON(scene, kind):
    assert_refused(scene.send_raw(INVALID_JSON[kind]), 400, "InvalidJSON")
    scene.assert_kept()


NON_OBJECT_BODIES = {
    "empty-list": b"[]",
    "list-of-the-body": None,
    "number": b"1",
    "negative-float": b"-1.5",
    "huge-number": b"1" + b"0" * 400,
    "string": b'"prompt"',
    "true": b"true",
    "false": b"false",
    "null": b"null",
}


@pytest.mark.parametrize("kind", NON_OBJECT_BODIES)
def test_a_non_object_body_is_refused_with_ValidationError(scene, kind):
    raw = NON_OBJECT_BODIES[kind] or json.dumps([scene.body]).encode()
    body = assert_refused(scene.send_raw(raw), 400, "ValidationError")
    assert list(body["errors"]) == ["payload"]
    scene.assert_kept()


@pytest.mark.parametrize("raw", [b"", b"   ", b"{}", b"\n\t "])
def test_an_empty_body_is_refused_with_ValidationError(scene, raw):
    body = assert_refused(scene.send_raw(raw), 400, "ValidationError")
    assert body["errors"]
    scene.assert_kept()


# --- Deep nesting --------------------------------------------------------------------------------

DEPTHS = [65, 100, 500, 900, 950, 990, 1000, 5000, 100_000]


def nested(kind: str, depth: int) -> str:
    if kind == "lists":
        return "[" * depth + "]" * depth
    return '{"a": ' * depth + "1" + "}" * depth


@pytest.mark.parametrize("kind", ["lists", "objects"])
@pytest.mark.parametrize("depth", DEPTHS)
def test_a_deeply_nested_field_is_refused_with_InvalidJSON(scene, kind, depth):
    assert_refused(scene.send_raw(scene.raw_with("unknown", nested(kind, depth))), 400, "InvalidJSON")
    scene.assert_kept()


@pytest.mark.parametrize("kind", ["lists", "objects"])
@pytest.mark.parametrize("depth", DEPTHS)
def test_deeply_nested_gen_metadata_is_refused_with_InvalidJSON(owner, popped, kind, depth):
    body = {"id": popped.generation_id, "generation": "x", "gen_metadata": "@@RAW@@"}
    raw = json.dumps(body).replace('"@@RAW@@"', f'[{{"type": "x", "value": {nested(kind, depth)}}}]')
    response = owner.client.generic(
        "POST", SUBMIT, raw.encode(), content_type="application/json", HTTP_APIKEY=owner.api_key
    )
    assert_refused(response, 400, "InvalidJSON")
    assert_still_processing(popped.request_id, popped.generation_id)


@pytest.mark.parametrize("depth", [100_000, 1000])
def test_a_body_of_deeply_nested_lists_is_refused_with_InvalidJSON(scene, depth):
    assert_refused(scene.send_raw(nested("lists", depth).encode()), 400, "InvalidJSON")
    scene.assert_kept()


def test_gen_metadata_nested_64_levels_deep_is_accepted_and_65_is_not(owner, popped):
    # The body object is level 1, gen_metadata 2, its item 3: 61 more lists make 64.
    value = json.loads(nested("lists", 61))
    deep = {"id": popped.generation_id, "generation": "x", "gen_metadata": [{"value": [value]}]}
    assert_refused(owner.post(SUBMIT, deep), 400, "InvalidJSON")
    assert_still_processing(popped.request_id, popped.generation_id)
    deepest_allowed = {**deep, "gen_metadata": [{"value": value}]}
    assert owner.post(SUBMIT, deepest_allowed).status_code == 200
    assert Generation.objects.get(pk=popped.generation_id).gen_metadata == [{"value": value}]


# --- Oversized bodies ----------------------------------------------------------------------------


def padded(body: dict, size: int) -> bytes:
    """`body` with an unknown `pad` field that brings it to exactly `size` bytes."""
    empty = len(json.dumps({**body, "pad": ""}).encode())
    raw = json.dumps({**body, "pad": "a" * (size - empty)}).encode()
    assert len(raw) == size
    return raw


@pytest.mark.parametrize("with_key", [True, False], ids=["with-key", "without-key"])
@pytest.mark.parametrize("size", [MIB + 1, 2 * MIB, 20 * MIB])
def test_a_body_over_1_MiB_with_a_content_length_is_refused_with_PayloadTooLarge(scene, size, with_key):
    extra = {} if with_key else {"HTTP_APIKEY": ""}
    assert_refused(scene.send_raw(padded(scene.body, size), **extra), 413, "PayloadTooLarge")
    scene.assert_kept()


def test_a_body_of_exactly_1_MiB_is_accepted(scene):
    assert scene.send_raw(padded(scene.body, MIB)).status_code == SUCCESS[scene.route]


@pytest.mark.parametrize("method", ["get", "delete"])
def test_an_oversized_body_on_a_status_or_heartbeat_route_is_refused_with_PayloadTooLarge(requester, method):
    raw = b"a" * (MIB + 1)
    for path in (STATUS + str(uuid.uuid4()), HEARTBEAT):
        response = requester.client.generic(method.upper(), path, raw, content_type="application/json")
        assert_refused(response, 413, "PayloadTooLarge")


@pytest.mark.parametrize("size", [MIB + 1, 2 * MIB])
def test_a_chunked_body_over_1_MiB_without_a_content_length_is_refused_with_PayloadTooLarge(scene, size):
    headers = [(b"apikey", scene.caller.api_key.encode()), (b"content-type", b"application/json")]
    status, raw = asgi_post(scene.path, chunked(padded(scene.body, size)), headers)
    assert status == 413
    assert json.loads(raw)["rc"] == "PayloadTooLarge"
    assert json.loads(raw)["message"]
    scene.assert_kept()


# Committed rows: the ASGI app serves sync views on threads of its own, with their own connections.
@pytest.mark.django_db(transaction=True)
def test_a_chunked_body_without_a_content_length_is_read(scene):
    headers = [(b"apikey", scene.caller.api_key.encode()), (b"content-type", b"application/json")]
    status, raw = asgi_post(scene.path, chunked(json.dumps(scene.body).encode(), 7), headers)
    assert status == SUCCESS[scene.route], raw


# Committed rows: the ASGI app serves sync views on threads of its own, with their own connections.
@pytest.mark.django_db(transaction=True)
def test_a_chunked_bad_body_without_a_content_length_is_refused_in_the_horde_shape(scene):
    headers = [(b"apikey", scene.caller.api_key.encode()), (b"content-type", b"application/json")]
    status, raw = asgi_post(scene.path, chunked(b'{"a": "\\u0000"}', 3), headers)
    assert status == 400
    assert json.loads(raw)["rc"] == "NulByteInPayload"
    scene.assert_kept()


def test_a_body_over_1_MiB_without_a_content_length_is_not_read_by_wsgi(scene):
    """The WSGI test client can drop Content-Length; WSGI then never reads the body."""
    response = scene.send_raw(padded(scene.body, 2 * MIB), CONTENT_LENGTH="")
    assert_refused(response, 400, "ValidationError")
    scene.assert_kept()


@pytest.mark.parametrize("length", ["abc", "-1", "1e3", "0x10", "1.5", "-99999999999999999999"])
def test_a_content_length_that_is_not_a_count_is_refused_with_BadRequest(scene, length):
    response = scene.send_raw(json.dumps(scene.body).encode(), CONTENT_LENGTH=length)
    assert_refused(response, 400, "BadRequest")
    scene.assert_kept()


def test_a_huge_content_length_is_refused_with_PayloadTooLarge(scene):
    response = scene.send_raw(json.dumps(scene.body).encode(), CONTENT_LENGTH="9" * 30)
    assert_refused(response, 413, "PayloadTooLarge")
    scene.assert_kept()


# --- Media types and methods ---------------------------------------------------------------------

MEDIA_TYPES = [
    "text/plain",
    "multipart/form-data; boundary=x",
    "application/x-www-form-urlencoded",
    "application/xml",
    "application/octet-stream",
    "application/vnd.api+json",
]


@pytest.mark.parametrize("content_type", MEDIA_TYPES)
def test_a_body_that_is_not_json_is_refused_with_UnsupportedMediaType(scene, content_type):
    response = scene.send_raw(json.dumps(scene.body).encode(), content_type=content_type)
    assert_refused(response, 415, "UnsupportedMediaType")
    scene.assert_kept()


WRONG_METHODS = [
    *[(path, method) for path in (ASYNC, POP, SUBMIT) for method in ("GET", "PUT", "PATCH", "DELETE")],
    *[(HEARTBEAT, method) for method in ("POST", "PUT", "PATCH", "DELETE")],
    *[("status", method) for method in ("POST", "PUT", "PATCH")],
    *[(path, method) for path in (ASYNC, POP, SUBMIT, HEARTBEAT) for method in ("TRACE", "BREW")],
]


@pytest.mark.parametrize(("path", "method"), WRONG_METHODS)
def test_a_wrong_http_method_is_refused_with_MethodNotAllowed(requester, path, method):
    if path == "status":
        path = STATUS + requester.request_text().json()["id"]
    response = requester.client.generic(
        method, path, b'{"prompt": "x"}', content_type="application/json", HTTP_APIKEY=requester.api_key
    )
    assert_refused(response, 405, "MethodNotAllowed")
    expected_requests = 1 if path.startswith(STATUS) else 0
    assert TextRequest.objects.filter(state=TextRequest.State.ACTIVE).count() == expected_requests


# --- Keys, models, workers and the horde's own rules ---------------------------------------------

BAD_KEYS = {
    "missing": None,
    "empty": "",
    "unknown": "abcdefghijklmnopqrstuv",
    "almost-anonymous": "000000000",
    "huge": "k" * 8000,
    "with-nul": "abc\x00def",
    "non-ascii": "cl\xe9-\xff",
}


@pytest.mark.parametrize("key", BAD_KEYS)
def test_a_missing_or_unknown_api_key_is_refused_with_InvalidAPIKey(scene, key):
    raw = json.dumps(scene.body).encode()
    api_key = BAD_KEYS[key]
    extra = {} if api_key is None else {"HTTP_APIKEY": api_key}
    response = scene.caller.client.generic("POST", scene.path, raw, content_type="application/json", **extra)
    assert_refused(response, 401, "InvalidAPIKey")
    scene.assert_kept()


def test_a_bad_body_without_an_api_key_is_refused_with_InvalidAPIKey_first(scene):
    assert_refused(scene.send_raw(b"{", HTTP_APIKEY=""), 401, "InvalidAPIKey")
    scene.assert_kept()


@pytest.mark.parametrize("body", [b"{", b"[]", b'{"id": 1, "name": 2, "models": 3}'])
def test_a_bad_body_with_an_unknown_api_key_is_refused_with_InvalidAPIKey_first(scene, body):
    # The worker routes check the key in their own statement, after the body: a bad body
    # still answers for the key first.
    assert_refused(scene.send_raw(body, HTTP_APIKEY=BAD_KEYS["unknown"]), 401, "InvalidAPIKey")
    scene.assert_kept()


def test_the_anonymous_key_popping_is_refused_with_AnonForbiddenWorker(requester, owner, anonymous):
    owner.pop("worker-1")
    request_id = requester.request_text(models=["m1"]).json()["id"]
    assert_refused(anonymous.pop("anonymous-worker"), 403, "AnonForbiddenWorker")
    assert not Worker.objects.filter(name="anonymous-worker").exists()
    assert_still_queued(request_id)


@pytest.mark.parametrize("who", ["anonymous", "stranger"])
def test_a_submit_by_another_account_is_refused_with_WrongCredentials(
    make_caller, anonymous, owner, popped, who
):
    other = anonymous if who == "anonymous" else make_caller("stranger")
    assert_refused(other.submit(popped.generation_id, "stolen"), 403, "WrongCredentials")
    assert_still_processing(popped.request_id, popped.generation_id)
    assert owner.submit(popped.generation_id).status_code == 200


def test_a_pop_under_a_name_owned_by_another_account_is_refused_with_WrongCredentials(make_caller, owner):
    owner.pop("worker-1")
    assert_refused(make_caller("stranger").pop("worker-1"), 403, "WrongCredentials")
    assert Worker.objects.get(name="worker-1").account_id == owner.account.id


@pytest.mark.parametrize(
    "models", [["no-such-model"], ["m2", "m3"], ["x" * 255]], ids=["one", "several", "long-name"]
)
def test_an_unknown_model_on_async_is_queued_with_a_warning_as_the_ai_horde_does(requester, owner, models):
    owner.pop("worker-1")
    created = requester.request_text(models=models)
    assert created.status_code == 202
    assert created.json()["message"].startswith("Warning: No available workers")
    assert TextRequest.objects.get().requested_models == models


def test_an_unknown_worker_id_on_async_is_refused_with_WorkerNotFound(requester, owner):
    owner.pop("worker-1")
    known = str(Worker.objects.get(name="worker-1").id)
    response = requester.request_text(workers=[known, str(uuid.uuid4())])
    assert_refused(response, 404, "WorkerNotFound")
    assert not TextRequest.objects.exists()


def test_an_empty_prompt_is_refused_with_MissingPrompt(requester):
    assert_refused(requester.request_text(""), 400, "MissingPrompt")
    assert not TextRequest.objects.exists()


def test_a_missing_prompt_is_refused_with_ValidationError(requester):
    body = assert_refused(requester.post(ASYNC, {"models": []}), 400, "ValidationError")
    assert_names_field(body, "prompt")


@pytest.mark.parametrize(
    "params",
    [
        {"max_length": 1000, "max_context_length": 500},
        {"max_length": 4096},
        {"max_length": 81, "max_context_length": 80},
    ],
    ids=["both-given", "default-context", "by-one"],
)
def test_a_context_shorter_than_max_length_is_refused_with_TokenOverflow(requester, params):
    assert_refused(requester.request_text(params=params), 400, "TokenOverflow")
    assert not TextRequest.objects.exists()


def test_a_second_submit_is_refused_with_DuplicateGen(owner, popped):
    assert owner.submit(popped.generation_id).status_code == 200
    assert_refused(owner.submit(popped.generation_id, "again"), 400, "DuplicateGen")
    assert Generation.objects.get(pk=popped.generation_id).text == "The end."


# --- Logs ----------------------------------------------------------------------------------------


@pytest.fixture
def every_log_record(caplog) -> pytest.LogCaptureFixture:
    """caplog at DEBUG on every logger, including those that do not propagate to the root."""
    caplog.set_level(logging.DEBUG)
    quiet = []
    for name, logger in list(logging.root.manager.loggerDict.items()):
        if isinstance(logger, logging.Logger):
            caplog.set_level(logging.DEBUG, logger=name)
            if not logger.propagate:
                logger.addHandler(caplog.handler)
                quiet.append(logger)
    yield caplog
    for logger in quiet:
        logger.removeHandler(caplog.handler)


def test_no_log_record_carries_prompt_or_response_text(every_log_record, requester, owner):
    prompt = "PROMPT-zebra-quasar-7f3a1c lullaby"
    response_text = "RESPONSE-ocelot-marmalade-91bc4e"
    owner.pop("worker-1")
    created = requester.request_text(prompt, models=["m1"], params={"max_length": 64})
    assert created.status_code == 202
    request_id = created.json()["id"]
    # Refused requests carrying the same texts must not log them either.
    assert_refused(requester.request_text(prompt, params={"max_length": 4096}), 400, "TokenOverflow")
    assert requester.request_text(prompt, models=["nope"]).status_code == 202  # queued, with a warning
    assert_refused(requester.request_text(prompt, params={"n": 10**30}), 400, "ValidationError")
    popped = owner.pop("worker-1").json()
    assert popped["payload"]["prompt"] == prompt
    assert_refused(owner.submit(popped["id"], response_text, seed="x"), 400, "ValidationError")
    assert_refused(owner.submit(uuid.uuid4(), response_text), 404, "InvalidJobID")
    assert owner.submit(popped["id"], response_text).status_code == 200
    assert_refused(owner.submit(popped["id"], response_text), 400, "DuplicateGen")
    status = requester.status(request_id).json()
    assert status["generations"][0]["text"] == response_text

    records = every_log_record.records
    assert records, "the refusals above log at least a warning each"
    for record in records:
        for text in (prompt, response_text):
            assert text not in record.getMessage(), record.name
            assert text not in repr(record.args), record.name
            assert text not in (record.exc_text or ""), record.name
    assert prompt not in every_log_record.text
    assert response_text not in every_log_record.text
