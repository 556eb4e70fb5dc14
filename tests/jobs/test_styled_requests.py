"""A text request's `style` (`jobs/styles.py`, as the AI Horde's `apply_style`): the prompt,
params and models a worker pops are the style's, a collection runs one of its styles, and a
style of another account's credits its author (`styled` kudos, the `style` record) from the
requester's horde tax (`jobs/services/requests.py` `horde_tax`)."""

from decimal import Decimal

import pytest
from django.core.management import call_command
from rest_framework.test import APIClient

from jobs.models import TextRequest
from kudos import ledger
from tests.conftest import give_kudos
from workers import styles
from workers.models import Style, StyleCollection

MODEL = "koboldcpp/noir-13B"


@pytest.fixture
def noir(trusted_owner) -> Style:
    return styles.create_style(
        caller=trusted_owner.account,
        name="noir",
        prompt="You are a hard-boiled detective.\n{p}\nDetective: {np}",
        params={
            "max_length": 120,
            "max_context_length": 4096,
            "temperature": 0.7,
            "stop_sequence": ["\nYou:"],
        },
        models=[MODEL],
    )


def _details(caller) -> dict:
    return APIClient().get("/api/v2/find_user", HTTP_APIKEY=caller.api_key).json()


def test_a_style_shapes_the_prompt_params_and_models_a_worker_pops(requester, owner, noir):
    queued = requester.request_text(
        "You: who did it?",
        style=str(noir.pk),
        params={"n": 2, "max_length": 40, "temperature": 1.9, "top_k": 5},
        models=["some-other-model"],
    )
    assert queued.status_code == 202, queued.content
    request = TextRequest.objects.get()
    assert request.requested_models == [MODEL] and request.n == 2

    job = owner.pop("noir-worker", models=[MODEL], max_context_length=4096).json()

    assert job["model"] == MODEL and len(job["ids"]) == 1
    payload = job["payload"]
    assert payload["prompt"] == "You are a hard-boiled detective.\nYou: who did it?\nDetective: "
    assert (payload["max_length"], payload["max_context_length"], payload["n"]) == (120, 4096, 1)
    assert (payload["temperature"], payload["stop_sequence"]) == (0.7, ["\nYou:"])
    assert "top_k" not in payload  # the style's params replace the request's, but for n
    noir.refresh_from_db()
    assert noir.use_count == 1


def test_a_style_without_lengths_runs_with_the_ai_hordes_defaults(requester, owner, trusted_owner):
    plain = styles.create_style(caller=trusted_owner.account, name="plain", prompt="{p}!", models=["m1"])
    requester.request_text("Hello", style="plain", params={"max_length": 300, "max_context_length": 4000})
    payload = owner.pop(models=["m1"]).json()["payload"]
    assert (payload["prompt"], payload["max_length"], payload["max_context_length"]) == ("Hello!", 80, 2048)
    assert Style.objects.get(pk=plain.pk).use_count == 1


def test_a_collection_runs_one_of_its_styles_and_counts_the_use_of_both(
    requester, owner, trusted_owner, noir
):
    sunny = styles.create_style(
        caller=trusted_owner.account, name="sunny", prompt="Cheerfully: {p}", models=[MODEL]
    )
    collection = styles.create_collection(
        caller=trusted_owner.account, name="moods", styles=["noir", "sunny"]
    )
    alias = f"trusted-owner#{trusted_owner.account.pk}"

    for reference in (str(collection.pk), f"collection::{alias}::moods"):
        assert requester.request_text("Hi", style=reference).status_code == 202

    prompts = set(TextRequest.objects.values_list("prompt", flat=True))
    assert prompts <= {"You are a hard-boiled detective.\nHi\nDetective: ", "Cheerfully: Hi"}
    collection.refresh_from_db()
    assert collection.use_count == 2
    assert sum(Style.objects.filter(pk__in=[noir.pk, sunny.pk]).values_list("use_count", flat=True)) == 2


def test_another_accounts_style_costs_the_style_fee_which_its_author_receives(requester, trusted_owner, noir):
    give_kudos(requester, "1000")
    give_kudos(trusted_owner, "100")
    plain = requester.request_text("Hi").json()
    styled = requester.request_text("Hi", style="noir").json()

    # The same cost, but the style fee of 2, paid with the horde tax.
    request = TextRequest.objects.get(pk=styled["id"])
    assert styled["kudos"] == round(request.kudos_reserved + 1 + 2)
    assert ledger.balance(requester.account.pk) == Decimal(1000) - 2 * 1 - 2
    author = _details(trusted_owner)
    assert author["kudos"] == 102 and author["kudos_details"]["styled"] == 2
    assert author["records"]["style"] == {"image": 0, "text": 1, "interrogation": 0}
    assert _details(requester)["records"]["style"]["text"] == 0
    assert plain["kudos"] == round(TextRequest.objects.get(pk=plain["id"]).kudos_reserved + 1)
    call_command("check_kudos")  # the ledger and every kept kudos_details still reconcile


def test_ones_own_style_and_a_dry_run_credit_no_one(trusted_owner, requester, noir):
    give_kudos(trusted_owner, "100")
    assert trusted_owner.request_text("Hi", style="noir").status_code == 202
    dry = requester.request_text("Hi", style="noir", dry_run=True)
    assert dry.status_code == 200
    details = _details(trusted_owner)
    assert details["kudos_details"]["styled"] == 0 and details["records"]["style"]["text"] == 0
    noir.refresh_from_db()
    assert noir.use_count == 1  # the owner's request; the dry run queued nothing


def test_an_unknown_style_is_refused_and_nothing_is_queued(requester):
    for reference in ("nothing", "00000000-0000-0000-0000-000000000000", "nobody#99999::noir"):
        refused = requester.request_text("Hi", style=reference)
        assert refused.status_code == 404 and refused.json()["rc"] == "StyleNotFound", refused.content
    assert not TextRequest.objects.exists()


def test_horde_sdks_template_fields_and_context_fit_are_refused_not_ignored(requester, noir):
    for body in (
        {"template_fields": {"caption": "a storm"}},
        {"context_fit": "reject"},
        {"context_fit": "ignore"},
    ):
        refused = requester.request_text("Hi", style="noir", **body)
        assert refused.status_code == 400 and refused.json()["rc"] == "StyleFieldNotServed", refused.content
        assert next(iter(body)) in refused.json()["message"]
    assert (
        requester.request_text("Hi", style="noir", template_fields=None, context_fit=None).status_code == 202
    )


def test_a_styled_prompt_past_the_prompt_limit_is_refused(requester, trusted_owner):
    styles.create_style(caller=trusted_owner.account, name="echo", prompt="{p}{p}{p}", models=["m1"])
    refused = requester.request_text("x" * 400_000, style="echo")
    assert refused.status_code == 400 and "1000000" in refused.json()["message"]
    assert not TextRequest.objects.exists()


def test_an_empty_collection_is_refused(requester, trusted_owner, noir):
    collection = styles.create_collection(caller=trusted_owner.account, name="moods", styles=["noir"])
    collection.styles.clear()
    refused = requester.request_text("Hi", style=str(collection.pk))
    assert refused.status_code == 400 and "holds no style" in refused.json()["message"]
    assert StyleCollection.objects.get().use_count == 0
