"""The AI Horde's kudos rates for text (`kudos.rates`) and the model table they read, with
figures worked by hand from the formulas: a 13B model at 1,024 tokens of context is the base."""

import json

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from kudos import rates, sizes
from kudos.models import TextModel


@pytest.mark.parametrize(
    ("context", "multiplier"),
    [(1024, 2.2), (2048, 3.4), (512, 1.2 + 1 / 2.2), (0, 0.1), (1024 * 2**6, 30.0)],
)
def test_the_context_multiplier_grows_faster_than_the_context_and_is_held_within_bounds(context, multiplier):
    assert rates.context_multiplier(context) == pytest.approx(multiplier)


def test_a_generation_earns_by_its_tokens_model_size_context_and_bridge():
    base = {"tokens": 100, "prompt_tokens": 1024, "trusted": False, "validated": True}
    assert rates.generation_kudos(billions=13, **base) == 22.88  # 100 x 13 / 125 x 2.2
    assert rates.generation_kudos(billions=13, **{**base, "prompt_tokens": 2048}) == 35.36  # x 3.4
    assert rates.generation_kudos(billions=13, **{**base, "validated": False}) == 6.86  # 30%
    assert rates.generation_kudos(billions=70, **base) == pytest.approx(172.52, abs=0.01)
    assert rates.generation_kudos(billions=7, **base) == pytest.approx(100 * 7 / 125 * 2.2, abs=0.01)


def test_an_unknown_model_earns_the_multiplier_alone_unless_its_worker_is_trusted():
    unknown = {"tokens": 100, "prompt_tokens": 1024, "billions": None, "validated": True}
    assert rates.generation_kudos(trusted=False, **unknown) == 2.2
    assert rates.generation_kudos(trusted=True, **unknown) == 5.94  # as a 2.7B model: 100 x 2.2 x 2.7 / 100


def test_a_request_costs_by_its_first_models_size_a_13b_models_when_it_names_none():
    base = {"max_length": 100, "max_context_length": 1024}
    assert rates.request_cost(billions=13, names_model=True, **base) == 28.6
    assert rates.request_cost(billions=None, names_model=False, **base) == 28.6
    assert rates.request_cost(billions=None, names_model=True, **base) == 5.94
    assert rates.HORDE_TAX == 1


def test_a_bridge_earns_in_full_only_when_the_ai_horde_validates_it_or_it_is_this_hordes_own():
    assert rates.is_validated("AI Horde Worker:24:https://github.com/db0/AI-Horde-Worker")
    assert rates.is_validated("hordeops-bridge:1.0.0:unknown")
    assert not rates.is_validated("my-own-script:1:http://example.org")
    assert not rates.is_validated("AI Horde Worker")  # not name:version:url


def test_the_model_table_finds_a_served_model_by_its_name_less_user_and_quantisation(db, tmp_path):
    reference = {
        "koboldcpp/Fimbulvetr-11B-v2": {"parameters": 11000000000, "baseline": "mistral"},
        "aphrodite/Qwen-14B": {"parameters": "14000000000"},
        "no-size": {"description": "left out"},
    }
    path = tmp_path / "db.json"
    path.write_text(json.dumps(reference))
    call_command("import_text_models", str(path))
    assert TextModel.objects.count() == 2
    assert sizes.billions("koboldcpp/Fimbulvetr-11B-v2-GGUF-Q4_K_M") == 11
    assert sizes.billions("aphrodite/Qwen-14B::alice") == 14
    assert sizes.billions("koboldcpp/unlisted-7B") is None
    reference["aphrodite/Qwen-14B"]["parameters"] = 15000000000
    path.write_text(json.dumps(reference))
    call_command("import_text_models", str(path))  # updated, not doubled
    assert (TextModel.objects.count(), sizes.billions("aphrodite/Qwen-14B")) == (2, 15)
    path.write_text("[1, 2]")
    with pytest.raises(CommandError):
        call_command("import_text_models", str(path))
