"""The official AI Horde client, horde_sdk 0.33.3, works unchanged against hordeops.

horde-sdk needs Python 3.12, so it lives in .venv-sdk (made by bin/sdk-venv, which bin/test
runs) and drives a live server from a subprocess: tests/sdk/horde_sdk_roundtrip.py.
"""

import json
import os
import subprocess
from pathlib import Path

import pytest
from rest_framework.test import APIClient

from jobs.models import Generation, TextRequest
from tests.conftest import Caller, give_kudos
from workers.models import Account, Worker
from workers.services import create_account

ROOT = Path(__file__).resolve().parent.parent
SDK_PYTHON = ROOT / ".venv-sdk" / "bin" / "python"
SCRIPT = ROOT / "tests" / "sdk" / "horde_sdk_roundtrip.py"
MODEL = "koboldcpp/sdk-roundtrip-7B"
SCRIPT_TIMEOUT_SECONDS = 120
# Variables that would point horde_sdk elsewhere or change how strictly it parses.
SDK_ENV_OVERRIDES = ("AI_HORDE_DEV_URL", "AI_HORDE_DEV_APIKEY", "TESTS_ONGOING")


def _run_roundtrip(
    base_url: str, requester_key: str, worker_key: str, cwd: Path, *, strict: bool = False
) -> dict:
    return _run_script(base_url, [requester_key, worker_key, MODEL], cwd, strict=strict)


def _run_script(base_url: str, args: list[str], cwd: Path, *, strict: bool) -> dict:
    if not SDK_PYTHON.exists():
        pytest.fail(f"{SDK_PYTHON.relative_to(ROOT)} is missing: run bin/sdk-venv (bin/test does it).")
    env = {k: v for k, v in os.environ.items() if k not in SDK_ENV_OVERRIDES}
    env["AI_HORDE_URL"] = base_url
    if strict:
        # The SDK's own test mode: every response model forbids keys it does not define.
        env["TESTS_ONGOING"] = "1"
    done = subprocess.run(
        [str(SDK_PYTHON), str(SCRIPT), *args],
        env=env,
        cwd=cwd,  # outside the work tree: nothing the client might write lands in the repo
        capture_output=True,
        text=True,
        timeout=SCRIPT_TIMEOUT_SECONDS,
    )
    if done.returncode != 0:
        pytest.fail(f"horde_sdk roundtrip exited {done.returncode}:\n{done.stderr[-4000:]}\n{done.stdout}")
    return json.loads(done.stdout)


@pytest.mark.django_db(transaction=True)
def test_horde_sdk_runs_a_text_request_through_a_worker(live_server, tmp_path) -> None:
    requester, requester_key = create_account(name="sdk-requester")
    worker_account, worker_key = create_account(name="sdk-worker-owner")
    give_kudos(Caller(account=requester, api_key=requester_key, client=None), "2000")  # to transfer 5

    seen = _run_roundtrip(f"{live_server.url}/api/", requester_key, worker_key, tmp_path)

    # The worker's first pop finds nothing but checks it in with its model.
    assert seen["first_pop"] == {"id": None, "ids": []}
    worker = Worker.objects.get(account=worker_account)
    assert MODEL in worker.served_models

    # The request the SDK created is the one the worker popped.
    text_request = TextRequest.objects.get(pk=seen["request_id"])
    generation = Generation.objects.get(pk=seen["job_id"])
    assert generation.request_id == text_request.pk
    assert seen["job_ids"] == [seen["job_id"]]
    assert seen["job_model"] == MODEL
    assert seen["payload_prompt"] == text_request.prompt == "Once upon a time, in a horde far away,"
    assert (seen["payload_n"], seen["payload_max_length"], seen["payload_max_context_length"]) == (
        1,
        80,
        1024,
    )
    assert seen["ttl"] == 150
    assert seen["skipped_is_empty"] is True

    # The submitted text round-trips exactly, and the reward is the one the server booked.
    submitted = seen["submitted_text"]
    assert submitted.startswith(" ") and "\n" in submitted and not submitted.isascii()
    generation.refresh_from_db()
    assert generation.state == Generation.State.DONE
    assert generation.text == submitted
    assert seen["reward"] == generation.reward > 0
    # Not a service account: its proxied request is refused in the AI Horde's words.
    assert seen["proxied"] == {
        "rc": "OnlyServiceAccountProxy",
        "message": "Only service accounts can provide a proxied_account value.",
    }

    status = seen["status"]
    assert status["done"] is True
    assert status["faulted"] is False
    assert (status["finished"], status["processing"], status["waiting"]) == (1, 0, 0)
    assert [g["text"] for g in status["generations"]] == [submitted]
    assert status["generations"][0] == {
        "text": submitted,
        "model": MODEL,
        "state": "ok",
        "worker_id": str(worker.id),
        "worker_name": worker.name,
        "seed": 0,
    }


@pytest.mark.django_db(transaction=True)
def test_horde_sdk_in_strict_mode_parses_every_answer_of_the_text_flow_and_the_discovery_routes(
    live_server, tmp_path
) -> None:
    requester, requester_key = create_account(name="sdk-strict-requester")
    Account.objects.filter(pk=requester.pk).update(service=True)  # it may send proxied_account
    worker_account, worker_key = create_account(name="sdk-strict-owner")
    give_kudos(Caller(account=requester, api_key=requester_key, client=None), "2000")  # to transfer 5

    seen = _run_roundtrip(f"{live_server.url}/api/", requester_key, worker_key, tmp_path, strict=True)

    assert seen["status"]["done"] is True
    # The service account's request with the AI Horde's own fields, queued as sent; no worker
    # of a validated bridge is online (the SDK's worker is not one): the AI Horde's warning.
    proxied = TextRequest.objects.get(pk=seen["proxied"]["id"])
    assert (proxied.proxied_account, proxied.validated_backends, proxied.disable_batching) == (
        "sdk-reader#1",
        True,
        True,
    )
    assert seen["proxied"]["message"].startswith("Warning: No available workers")
    assert seen["proxied"]["unknown_keys"] == []
    assert seen["unknown_keys"] == {"pop_response": [], "async_response": [], "status_response": []}
    # The discovery routes, each parsed by its strict SDK model.
    found = seen["discovery"]
    worker = Worker.objects.get(account=worker_account)
    assert found["find_user"] == {
        "username": f"sdk-strict-owner#{worker_account.id}",
        "worker_count": 1,
        "worker_ids": [str(worker.id)],
    }
    assert found["user"] == {"username": f"sdk-strict-owner#{worker_account.id}", "worker_ids": None}
    assert found["worker"] == {
        "id": str(worker.id),
        "name": worker.name,
        "online": True,
        "models": [MODEL],
        "owner": f"sdk-strict-owner#{worker_account.id}",
        "requests_fulfilled": 1,
    }
    assert found["modified"] == {"maintenance": False, "info": "a roundtrip worker"}
    assert MODEL in found["models"] and found["model"] == [[MODEL, 1]]
    assert found["text_worker_count"] >= 1
    assert found["totals_total"]["requests"] >= 1 and found["per_model_total"][MODEL] >= 1
    assert worker.name in found["all_types"]
    assert found["deleted"] == {"id": str(worker.id), "name": worker.name}
    # The kudos routes: a transfer, and the receiver's balance and kudos_details after it.
    assert found["transferred"] == 5
    assert found["kudos"]["after"] == found["kudos"]["before"] + 5 and found["kudos"]["received"] == 5
    worker.refresh_from_db()
    assert worker.deleted_at is not None


@pytest.mark.django_db(transaction=True)
def test_horde_sdk_in_strict_mode_parses_workers_and_users_with_fractional_kudos(
    live_server, tmp_path
) -> None:
    # Fractions are the normal case: the uptime reward is halved for an unknown model and cut
    # to 30% for an unvalidated bridge, and a job's reward is rarely whole.
    trusted, _ = create_account(name="sdk-fleet-trusted", trusted=True)
    untrusted, untrusted_key = create_account(name="sdk-fleet-untrusted")
    moderator, moderator_key = create_account(name="sdk-fleet-moderator")
    Account.objects.filter(pk=moderator.pk).update(moderator=True)
    common = {"served_models": [MODEL], "chat": True, "bridge_agent": "hordeops-bridge:1:https://example.org"}
    Worker.objects.create(
        name="sdk-fleet-fast", account=trusted, kudos_rewards=12.25, kudos_uptime=27.5, completed_jobs=3,
        speed=21.37, tokens_generated=512, info="fractions", **common,
    )  # fmt: skip
    Worker.objects.create(
        name="sdk-fleet-resting", account=untrusted, kudos_rewards=0.75, kudos_uptime=13.2, maintenance=True,
        maintenance_reason="resting", **common,
    )  # fmt: skip
    give_kudos(Caller(account=untrusted, api_key=untrusted_key, client=None), "30.25")
    give_kudos(Caller(account=trusted, api_key="", client=None), "42.5")
    spec = {
        "moderator_key": moderator_key,
        "owner_key": untrusted_key,
        "workers": ["sdk-fleet-fast", "sdk-fleet-resting"],
        "users": [trusted.pk, untrusted.pk],
    }

    seen = _run_script(f"{live_server.url}/api/", ["fleet", json.dumps(spec)], tmp_path, strict=True)

    fast = {
        "online": True,
        "trusted": True,
        "maintenance_mode": False,
        "kudos_rewards": 39.75,
        # The AI Horde's WorkerKudosDetails: `uptime` an integer, the fraction left out.
        "kudos_details": {"generated": 12.25, "uptime": 27},
    }
    resting = {
        "online": True,
        "trusted": False,
        "maintenance_mode": True,
        "kudos_rewards": 13.95,
        "kudos_details": {"generated": 0.75, "uptime": 13},
    }
    owner = f"sdk-fleet-untrusted#{untrusted.pk}"
    assert seen["listed"]["anyone"] == {
        "sdk-fleet-fast": {**fast, "owner": None},
        "sdk-fleet-resting": {**resting, "owner": None},
    }
    assert seen["listed"]["owner"]["sdk-fleet-resting"] == {**resting, "owner": owner}
    assert seen["listed"]["moderator"]["sdk-fleet-fast"] == {
        **fast,
        "owner": f"sdk-fleet-trusted#{trusted.pk}",
    }
    assert seen["single"]["sdk-fleet-resting"] == {
        "by_name": {**resting, "owner": None},
        "by_id_as_moderator": {**resting, "owner": owner},
    }
    assert seen["users"] == {
        str(trusted.pk): {"kudos": 42.5, "accumulated": 0.0},
        str(untrusted.pk): {"kudos": 30.25, "accumulated": 0.0},
    }
    assert seen["find_user"]["kudos"] == 30.25 and len(seen["find_user"]["worker_ids"]) == 1
    assert seen["moderator"] == {"moderator": True, "evaluating_kudos": 0.0}


@pytest.mark.django_db(transaction=True)
def test_horde_sdk_in_strict_mode_makes_uses_changes_and_deletes_a_shared_key(live_server, tmp_path) -> None:
    owner, owner_key = create_account(name="sdk-key-owner")

    seen = _run_script(f"{live_server.url}/api/", ["sharedkeys", owner_key], tmp_path, strict=True)

    alias = f"sdk-key-owner#{owner.pk}"
    made = {"username": alias, "name": "sdk bot", "kudos": 500, "utilized": 0, "max_text_tokens": 100}
    assert {k: v for k, v in seen["made"].items() if k != "expiry"} == made
    assert seen["made"]["expiry"].endswith(" -0000") and seen["read"] == seen["made"]
    assert seen["owner_keys"] == [seen["id"]]
    assert seen["find_user"] == {"username": f"{alias} (Shared Key: sdk bot)", "sharedkey_ids": None}
    request = TextRequest.objects.get(pk=seen["request"]["id"])
    assert request.account == owner
    spent = request.kudos_reserved + 1
    assert seen["used"]["utilized"] == int(spent) and seen["used"]["kudos"] == int(500 - spent)
    # The SDK's modify sends the settings given, not its default expiry: that stays.
    assert seen["changed"] == {**seen["used"], "name": "sdk bot 2", "kudos": -1, "max_text_tokens": -1}
    assert (seen["deleted"], seen["after_delete"]) == ("OK", "InvalidAPIKey")


@pytest.mark.django_db(transaction=True)
def test_horde_sdk_in_strict_mode_makes_lists_reads_changes_and_deletes_a_team(live_server, tmp_path) -> None:
    creator, creator_key = create_account(name="sdk-team-creator", trusted=True)
    owner, owner_key = create_account(name="sdk-team-player")
    worker = Worker.objects.create(name="sdk-team-worker", account=owner, served_models=[MODEL])

    args = ["teams", creator_key, owner_key, str(worker.pk)]
    seen = _run_script(f"{live_server.url}/api/", args, tmp_path, strict=True)

    team_id = seen["made"]["id"]
    assert seen["made"] == {"id": team_id, "name": "sdk team", "info": "Made by horde_sdk."}
    assert seen["joined"] == "sdk team"
    shown = {
        "name": "sdk team",
        "creator": f"sdk-team-creator#{creator.pk}",
        "worker_count": 1,
        "workers": [str(worker.pk)],
        "models": [[MODEL, 1]],
        "requests_fulfilled": 0,
    }
    assert seen["listed"] == [shown] and seen["read"] == shown
    assert seen["worker_team"] == "sdk team"
    assert seen["changed"] == {"id": team_id, "name": "sdk team 2", "info": "Renamed."}
    assert seen["deleted"] == {"id": team_id, "name": "sdk team 2"}
    assert seen["team_after_delete"] is None
    assert Worker.objects.get(pk=worker.pk).team_id is None


@pytest.mark.django_db(transaction=True)
def test_horde_sdk_in_strict_mode_reads_the_news_and_the_documents(live_server, tmp_path) -> None:
    from datetime import date

    from front.models import HordeDocument, Newspiece

    Newspiece.objects.create(
        date_published=date(2026, 12, 1),
        title="Hello",
        newspiece="A new horde.",
        tags=["launch"],
        more_info_urls=["https://example.org/launch"],
    )
    HordeDocument.objects.create(kind="terms", html="<p>Be kind.</p>", markdown="Be kind.")

    seen = _run_script(f"{live_server.url}/api/", ["documents"], tmp_path, strict=True)

    assert seen["news"] == [
        {
            "date_published": "2026-12-01",
            "importance": "Information",
            "newspiece": "A new horde.",
            "tags": ["launch"],
            "title": "Hello",
            "more_info_urls": ["https://example.org/launch"],
        }
    ]
    # Unwritten, a document is empty but still the SDK's HordeDocument; the SDK asks for html.
    assert seen["documents"] == {
        "terms": {"html": "<p>Be kind.</p>", "markdown": None},
        "privacy": {"html": "", "markdown": None},
        "sponsors": {"html": "", "markdown": None},
    }


@pytest.mark.django_db(transaction=True)
def test_horde_sdk_in_strict_mode_sends_lists_reads_and_deletes_worker_messages(
    live_server, tmp_path
) -> None:
    """Each of the SDK's four worker-message requests is served; the answers are the AI Horde's,
    which the SDK's own message model refuses, and only for the fields the AI Horde answers and it
    lacks or mistypes (its `expiry` an integer, no `id`, `user_id` or `created`)."""
    from workers.models import WorkerMessage

    moderator, moderator_key = create_account(name="sdk-message-moderator")
    Account.objects.filter(pk=moderator.pk).update(moderator=True)
    owner, owner_key = create_account(name="sdk-message-owner")
    Caller(account=owner, api_key=owner_key, client=APIClient()).pop("sdk-messaged")
    worker = Worker.objects.get(name="sdk-messaged")

    seen = _run_script(
        f"{live_server.url}/api/",
        ["workermessages", moderator_key, owner_key, str(worker.pk)],
        tmp_path,
        strict=True,
    )

    sdk_model_gaps = [
        "created:extra_forbidden",
        "expiry:int_parsing",
        "id:extra_forbidden",
        "user_id:extra_forbidden",
    ]
    assert seen["refused_fields"] == {
        "sent": sdk_model_gaps,
        "own": sdk_model_gaps,
        "listed": sdk_model_gaps,
        "read": sdk_model_gaps,
    }
    by_moderator, by_owner = seen["by_moderator"], seen["by_owner"]
    assert (by_moderator["worker_id"], by_moderator["origin"], by_moderator["user_id"]) == (
        str(worker.pk),
        "Mods",
        str(moderator.pk),
    )
    assert by_owner["origin"] == str(owner.pk)  # an owner's origin is their id
    assert seen["listed"] == [by_moderator, by_owner] and seen["read"] == by_moderator
    assert (seen["deleted"], seen["owner_deleting_the_moderators"]) == ("OK", "Forbidden")
    assert list(WorkerMessage.objects.values_list("pk", flat=True)) == [int(by_moderator["id"])]


@pytest.mark.django_db(transaction=True)
def test_horde_sdk_in_strict_mode_blocks_a_workers_address_and_lifts_it(live_server, tmp_path) -> None:
    from workers.models import AddressTimeout

    moderator, moderator_key = create_account(name="sdk-block-moderator")
    Account.objects.filter(pk=moderator.pk).update(moderator=True)
    owner, owner_key = create_account(name="sdk-block-owner")
    Caller(account=owner, api_key=owner_key, client=APIClient(REMOTE_ADDR="203.0.113.9")).pop("sdk-blocked")
    worker = Worker.objects.get(name="sdk-blocked")

    seen = _run_script(
        f"{live_server.url}/api/", ["blockworker", moderator_key, str(worker.pk)], tmp_path, strict=True
    )

    assert seen == {"blocked": "OK", "lifted": "OK"}
    assert not AddressTimeout.objects.exists()  # set, then lifted


@pytest.mark.django_db(transaction=True)
def test_horde_sdk_in_strict_mode_lists_users_changes_one_as_a_moderator_and_itself_and_awards_kudos(
    live_server, tmp_path
) -> None:
    """Every call horde_sdk 0.33.3 makes for these routes; it has no request for
    `/v2/status/modes` (GET or PUT), so none is sent here."""
    from django.core.management import call_command

    from kudos import ledger

    moderator, moderator_key = create_account(name="sdk-users-moderator")
    Account.objects.filter(pk=moderator.pk).update(moderator=True)
    owner, owner_key = create_account(name="sdk-users-owner")
    give_kudos(Caller(account=moderator, api_key=moderator_key, client=None), "1000")

    args = ["moderators", moderator_key, owner_key, str(owner.pk)]
    seen = _run_script(f"{live_server.url}/api/", args, tmp_path, strict=True)

    alias = f"sdk-users-moderator#{moderator.pk}"
    assert seen["by_kudos"][0] == alias and f"sdk-users-owner#{owner.pk}" in seen["by_kudos"]
    assert seen["by_age"][-2:] == [alias, f"sdk-users-owner#{owner.pk}"]
    assert seen["moderated"] == {
        "new_kudos": 50.0,
        "trusted": True,
        "concurrency": 5,
        "worker_invited": 2,
        "admin_comment": "Runs a big box.",
        "flagged": True,
    }
    assert seen["reset"] == {"new_suspicion": 0}
    assert seen["own"] == {"public_workers": True, "contact": "me@example.org", "username": "sdk-renamed"}
    assert (seen["awarded"], seen["stranger_refused"]) == (25.0, "NotModerator")
    assert seen["me"] == {
        "username": f"sdk-renamed#{owner.pk}",
        "kudos": 75.0,
        "trusted": True,
        "flagged": False,
        "concurrency": 5,
        "worker_invited": 2,
        "contact": "me@example.org",
    }
    assert ledger.balance(owner.pk) == 75
    call_command("check_kudos")  # the awards were minted: the ledger still balances


@pytest.mark.django_db(transaction=True)
def test_horde_sdk_in_strict_mode_makes_uses_changes_and_deletes_a_text_style_and_a_collection(
    live_server, tmp_path
) -> None:
    """Every style and collection request horde_sdk models, in one run; the collections' answers
    only as far as its model allows (`type` is `Literal["image"]` there, where the AI Horde
    answers a text collection's `"text"`)."""
    from workers.models import Style, StyleCollection

    creator, creator_key = create_account(name="sdk-stylist", trusted=True)
    requester, requester_key = create_account(name="sdk-styled")
    owner, worker_key = create_account(name="sdk-style-worker")

    seen = _run_script(
        f"{live_server.url}/api/",
        ["styles", creator_key, requester_key, worker_key, MODEL],
        tmp_path,
        strict=True,
    )

    style_id = seen["made"]["id"]
    alias = f"sdk-stylist#{creator.pk}"
    shown = {
        "id": style_id,
        "name": "sdk-noir",
        "prompt": "Noir: {p}",
        "models": [MODEL],
        "tags": ["dark"],
        "creator": alias,
        "params": {"max_length": 64, "max_context_length": 1024, "temperature": 0.7},
    }
    assert seen["listed"] == [shown] and seen["by_id"] == shown and seen["by_name"] == shown
    assert seen["changed"] == {"id": style_id, "message": "OK"}
    collection_id = seen["collected"]["id"]
    assert seen["updated"] == {"id": collection_id, "message": "OK"}
    # The SDK's model refuses the `type` of a text collection, and nothing else of the answer.
    # Its client cannot send a collection by name (no `collection_name` path field): served all
    # the same (tests/workers/test_styles.py).
    assert seen["collection_by_name_unsent"] == "GET requests cannot have a body"
    assert seen["collection_refused_fields"] == {name: ["type:literal_error"] for name in ("listed", "by_id")}
    collection = {
        "id": collection_id,
        "name": "sdk moods 2",
        "type": "text",
        "info": "Moods.",
        "public": True,
        "styles": [{"name": f"{alias}::style::sdk-noir", "id": style_id}],
        "use_count": 0,
    }
    assert seen["collection_answers"] == {"listed": [collection], "by_id": collection}
    # The worker pops the request as the (changed) style shapes it.
    assert seen["job"]["id"] is not None and seen["job"]["model"] == MODEL
    assert seen["job"]["prompt"] == "Noir, again: Once upon a time, in a horde far away,"
    assert (seen["job"]["max_length"], seen["job"]["temperature"]) == (64, 0.7)
    assert seen["author"] == {
        "customizer": False,
        "styles": [{"name": f"{alias}::style::sdk-noir", "id": style_id, "type": "text"}],
        "styled": 2.0,
        "style_records": 1,
    }
    assert seen["deleted"] == ["OK", "OK"] and seen["after_delete"] == "StyleNotFound"
    assert not Style.objects.exists() and not StyleCollection.objects.exists()
