"""jobs.serializers: the hot routes' inputs share their fields, and still validate each body alone."""

import threading
import uuid

import pytest

from jobs.serializers import PopInput, ProgressInput, SubmitInput

POP = {"name": "w", "models": ["m1", "m2"], "max_length": 1024}


def test_a_worker_inputs_fields_are_built_once_per_thread():
    first, second = PopInput(data=POP), PopInput(data={**POP, "name": "other"})
    assert first.fields is second.fields
    elsewhere: list = []
    thread = threading.Thread(target=lambda: elsewhere.append(PopInput(data=POP).fields))
    thread.start()
    thread.join()
    assert elsewhere[0] is not first.fields
    assert list(elsewhere[0]) == list(first.fields)


def test_bodies_validated_in_turn_keep_their_own_values_and_defaults():
    small = PopInput(data={"name": "a", "models": ["x"]})
    large = PopInput(data={**POP, "threads": 4, "amount": 3})
    assert large.is_valid() and small.is_valid()
    assert small.validated_data == {
        "name": "a",
        "models": ["x"],
        "max_length": 512,
        "max_context_length": 2048,
        "threads": 1,
        "nsfw": False,
        "bridge_agent": "unknown:0:unknown",
        "amount": 1,
        "chat": False,
        "tools": False,
        "structured_outputs": False,
        "wait_seconds": 0,
    }
    assert (large.validated_data["threads"], large.validated_data["amount"]) == (4, 3)
    assert large.validated_data["models"] == ["m1", "m2"]


def test_a_refused_body_does_not_leave_its_errors_to_the_next():
    refused = PopInput(data={**POP, "models": [], "threads": 99})
    assert not refused.is_valid()
    assert set(refused.errors) == {"models", "threads"}
    accepted = PopInput(data=POP)
    assert accepted.is_valid(), accepted.errors
    assert accepted.errors == {}


def test_submit_and_progress_inputs_validate_alike_on_many_threads():
    problems: list[str] = []

    def validate(index: int) -> None:
        job = str(uuid.uuid4())
        for seq in range(1, 200):
            progress = ProgressInput(data={"id": job, "seq": seq, "delta": f"{index}-{seq}"})
            if not progress.is_valid() or progress.validated_data["delta"] != f"{index}-{seq}":
                problems.append(f"progress {index} {seq}")
            submit = SubmitInput(data={"id": job, "generation": f"end {index}", "seed": seq})
            if not submit.is_valid() or submit.validated_data["seed"] != seq:
                problems.append(f"submit {index} {seq}")
            if SubmitInput(data={"id": "not-a-uuid"}).is_valid():
                problems.append(f"bad id accepted {index}")

    threads = [threading.Thread(target=validate, args=(index,)) for index in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert problems == []


def test_a_worker_input_refuses_a_context_its_shared_fields_could_not_see():
    with pytest.raises(TypeError):
        PopInput(data=POP, context={"request": None})


ASYNC_BODIES = [
    {"prompt": "Once upon a time", "params": {"max_length": 80, "n": 2, "stop_sequence": ["\nYou:"]}},
    {"prompt": "x", "params": {"sampler_order": [6, 0, 1, 2, 3, 4, 5], "temperature": 0.7}},
    {"prompt": "x", "params": {"sampler_order": [0, 0, 1, 2, 3, 4, 5]}},  # a method's refusal
    {"prompt": "x", "params": {"max_length": 9, "top_p": 2}},  # two nested field errors
    {"prompt": "x", "models": ["m"] * 201, "params": "not an object"},
    {"prompt": "plain"},
]


def _async_results(bodies: list[dict]) -> list:
    from jobs.serializers import TextAsyncInput

    results = []
    for body in bodies:
        serializer = TextAsyncInput(data=body)
        valid = serializer.is_valid()
        results.append((valid, dict(serializer.validated_data) if valid else serializer.errors))
    return results


def test_an_async_body_with_nested_params_validates_alone_in_any_order():
    """The async input and its nested params share their fields too: each body's answer,
    refusals from a nested field or a method included, is the same in any order."""
    results: dict[str, list] = {}

    def run(name: str, bodies: list[dict]) -> None:
        results[name] = _async_results(bodies)

    for name, bodies in (("forward", ASYNC_BODIES), ("backward", ASYNC_BODIES[::-1])):
        thread = threading.Thread(target=run, args=(name, bodies))  # fields built afresh
        thread.start()
        thread.join()
    assert results["forward"] == results["backward"][::-1]
    assert [valid for valid, _ in results["forward"]] == [True, True, False, False, False, True]
    assert results["forward"][0][1]["params"]["stop_sequence"] == ["\nYou:"]
    assert set(results["forward"][3][1]["params"]) == {"max_length", "top_p"}
    assert "sampler_order" in results["forward"][2][1]["params"]
    assert results["forward"][5][1]["models"] == [] and "params" not in results["forward"][5][1]
