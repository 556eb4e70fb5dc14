"""`quick_validator`: a worker body checked in one pass is what DRF's validation makes of it, and
anything it does not plainly accept is left to DRF (which alone writes the error messages)."""

import dataclasses
import uuid

import pytest
from hypothesis import given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from hordeops.serializers import quick_validator
from jobs import serializers as s
from workers.declaration import WorkerDeclaration

WORKER_INPUTS = (s.PopInput, s.ProgressInput, s.SubmitInput)
ID = "6b1a4d9e-4f4e-4b8e-9f44-3d3e1d1c2b1a"


def typed(value):
    """The value with every type spelled out: True == 1 and 1.0 == 1 in Python, not here."""
    if isinstance(value, dict):
        return ("dict", sorted((key, typed(item)) for key, item in value.items()))
    if isinstance(value, list):
        return ("list", [typed(item) for item in value])
    return (type(value).__name__, value)


def drf(serializer_class, body):
    serializer = serializer_class(data=body)
    return dict(serializer.validated_data) if serializer.is_valid() else None


TEXT = st.one_of(
    st.text(max_size=12),
    st.sampled_from(["", " ", "  padded  ", "a\x00b", "lone \ud800 surrogate", "é", "x" * 100, "x" * 101,
                     "m" * 255, "m" * 256, ID, ID.upper(), "{" + ID + "}", "ok", "censored", "faulted",
                     "csam", "OK", "\u00a0nbsp\u00a0", "\n"]),
)  # fmt: skip
NUMBERS = st.one_of(
    st.integers(-25, 60),
    st.sampled_from([0, 1, 20, 21, 50, 51, 200, 201, 16384, 1_048_576, 1_048_577, 10_000_000, 10_000_001,
                     2**63 - 1, 2**63, -(2**63), -(2**63) - 1, 10**18, 10**19, 10**5000]),
    st.floats(allow_nan=False, allow_infinity=False),
)  # fmt: skip
SCALARS = st.one_of(st.none(), st.booleans(), NUMBERS, TEXT)
VALUES = st.one_of(
    SCALARS,
    st.lists(SCALARS, max_size=4),
    st.builds(lambda n: ["model"] * n, st.sampled_from([0, 1, 200, 201])),
    st.lists(st.dictionaries(st.text(max_size=3), SCALARS, max_size=3), max_size=3),
    st.builds(lambda n: [{}] * n, st.sampled_from([50, 51])),
    st.dictionaries(st.text(max_size=3), SCALARS, max_size=3),
)


VALID = {
    s.PopInput: [
        # the scribe worker's pop, and the smallest one
        {"name": "scribe", "models": ["koboldcpp/Llama-3-8B"], "max_length": 512, "max_context_length": 8192,
         "priority_usernames": [], "softprompts": [], "bridge_agent": "AI Horde Worker reGen:9.0.0:https://x",
         "threads": 1, "amount": 1, "nsfw": True},
        {"name": " padded ", "models": [" m "]},
        {"name": "chat", "models": ["m"] * 200, "chat": True, "max_length": 16384, "amount": 20},
        {"name": "waits", "models": ["m"], "chat": True, "wait_seconds": 20},
        {"name": "waits-a-little", "models": ["m"], "wait_seconds": 0.25},
    ],
    s.ProgressInput: [
        {"id": ID, "seq": 1, "delta": "Hello"},
        {"id": ID.upper(), "seq": 10_000_000, "delta": "  καλημέρα 🌅 ", "tokens": None},
        {"id": ID, "seq": 2, "delta": "", "tokens": 0},
    ],
    s.SubmitInput: [
        {"id": ID, "generation": "The end.", "seed": 7,
         "gen_metadata": [{"type": "censorship", "value": None}]},
        {"id": ID, "generation": "  kept as sent \n", "state": "faulted"},
        {"id": ID},
    ],
}  # fmt: skip


def _either(first, second):
    """One strategy or the other, half the time each (`one_of` flattens: a branch of many)."""
    return st.booleans().flatmap(lambda pick: first if pick else second)


def bodies(serializer_class):
    """Bodies of every shape, most of them a valid body with a field or two changed or left out."""
    names = list(serializer_class._declared_fields)

    # A field changed to anything, or to what another valid body sends in it.
    sent = {name: [body[name] for body in VALID[serializer_class] if name in body] for name in names}
    changes = {name: _either(st.sampled_from(sent[name] or [None]), VALUES) for name in names}
    changes["unknown"] = VALUES

    def changed(body: dict, changes: dict, dropped: set) -> dict:
        return {name: value for name, value in {**body, **changes}.items() if name not in dropped}

    near = st.builds(
        changed,
        st.sampled_from(VALID[serializer_class]),
        st.one_of(st.just({}), st.fixed_dictionaries({}, optional=changes)),
        st.one_of(st.just(set()), st.sets(st.sampled_from(names), max_size=2)),
    )
    anything = st.fixed_dictionaries({}, optional={**{name: VALUES for name in names}, "unknown": VALUES})
    return _either(near, st.one_of(anything, SCALARS, st.lists(SCALARS, max_size=2)))


@pytest.mark.parametrize("serializer_class", WORKER_INPUTS, ids=lambda c: c.__name__)
def test_a_body_checked_in_one_pass_is_what_drf_makes_of_it(serializer_class):
    assert quick_validator(serializer_class) is not None

    @hypothesis_settings(max_examples=1500, deadline=None, database=None)
    @given(bodies(serializer_class))
    def check(body):
        quick = serializer_class.quick(body)
        if quick is not None:
            assert typed(quick) == typed(drf(serializer_class, body))
        taken.append(quick is not None)

    taken: list[bool] = []
    check()
    assert 50 <= sum(taken) <= len(taken) - 50, sum(taken)  # both paths were tried, many times


@pytest.mark.parametrize(
    ("serializer_class", "body"),
    [(cls, body) for cls, valid in VALID.items() for body in valid],
    ids=lambda v: v.__name__ if isinstance(v, type) else "",
)
def test_the_bodies_workers_send_take_the_one_pass_check(serializer_class, body):
    quick = serializer_class.quick(body)
    assert quick is not None
    assert typed(quick) == typed(drf(serializer_class, body))


@pytest.mark.parametrize(
    ("serializer_class", "body"),
    [
        (s.PopInput, {"name": "w", "models": []}),
        (s.PopInput, {"name": "w", "models": ["m"], "threads": 51}),
        (s.PopInput, {"name": "w", "models": ["m"], "nsfw": 1}),
        (s.PopInput, {"name": "   ", "models": ["m"]}),
        (s.PopInput, {"models": ["m"]}),
        (s.PopInput, {"name": "w", "models": ["m"], "wait_seconds": 30.5}),
        (s.PopInput, {"name": "w", "models": ["m"], "wait_seconds": -1}),
        (s.PopInput, {"name": "w", "models": ["m"], "wait_seconds": "5"}),
        (s.PopInput, {"name": "w", "models": ["m"], "wait_seconds": True}),
        (s.ProgressInput, {"id": ID, "seq": True, "delta": "x"}),
        (s.ProgressInput, {"id": "not-a-uuid", "seq": 1, "delta": "x"}),
        (s.ProgressInput, {"id": ID, "seq": 1, "delta": "a\x00b"}),
        (s.ProgressInput, {"id": ID, "seq": 1, "delta": "lone \ud800"}),
        (s.SubmitInput, {"id": ID, "state": "OK"}),
        (s.SubmitInput, {"id": ID, "gen_metadata": [{}] * 51}),
        (s.SubmitInput, [ID]),
    ],
)
def test_a_body_drf_refuses_is_left_to_drf_for_its_message(serializer_class, body):
    assert serializer_class.quick(body) is None
    assert drf(serializer_class, body) is None


@pytest.mark.parametrize("body", VALID[s.PopInput])
def test_a_pop_body_is_built_into_the_same_declaration_whichever_path_checked_it(body, monkeypatch):
    quick = s.PopInput.validated(body)
    monkeypatch.setattr(s.PopInput, "quick", classmethod(lambda cls, data: None))  # DRF's path
    by_drf = s.PopInput.validated(body)
    assert isinstance(quick, WorkerDeclaration) and isinstance(by_drf, WorkerDeclaration)
    assert typed(dataclasses.asdict(quick)) == typed(dataclasses.asdict(by_drf))
    assert quick == WorkerDeclaration(**dataclasses.asdict(quick))  # every field, and only those


def test_a_pop_body_holds_exactly_what_a_worker_declares():
    declared = [field.name for field in dataclasses.fields(WorkerDeclaration)]
    assert sorted(s.PopInput._declared_fields) == sorted(declared)


def test_a_default_list_is_a_new_list_for_every_body():
    first, second = (s.SubmitInput.quick({"id": ID}) for _ in range(2))
    assert first["gen_metadata"] == [] and first["gen_metadata"] is not second["gen_metadata"]
    assert first["id"] == uuid.UUID(ID)


def test_a_serializer_with_rules_of_its_own_has_no_one_pass_check():
    # TextParamsInput checks sampler_order and stop_sequence in methods, and has float fields.
    assert quick_validator(s.TextParamsInput) is None
    assert quick_validator(s.TextAsyncInput) is None  # a nested serializer
