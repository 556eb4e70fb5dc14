"""The AI Horde's remaining text request fields: `validated_backends` (only workers of a bridge
the horde validates), `disable_batching` (a pop takes one job at a time) and `proxied_account`
(a service account's own user, kept on the request)."""

from jobs.models import Generation, TextRequest
from jobs.waits import Offer, Waiter
from workers.models import Account

VALIDATED = "KoboldCppEmbedWorker:1.80:https://github.com/LostRuins/koboldcpp"
OWN_SCRIPT = "my-own-script:1:https://example.org"


def test_a_worker_outside_the_validated_list_is_not_offered_a_validated_backends_request(
    requester, owner, make_caller
):
    validated = make_caller()
    assert owner.pop("own-script", bridge_agent=OWN_SCRIPT).json()["id"] is None
    assert validated.pop("koboldcpp", bridge_agent=VALIDATED).json()["id"] is None
    assert requester.request_text(validated_backends=True).status_code == 202
    assert TextRequest.objects.get().validated_backends

    empty = owner.pop("own-script", bridge_agent=OWN_SCRIPT).json()
    # The AI Horde's reason for it: the worker's bridge is not one it validates.
    assert (empty["id"], empty["skipped"]) == (None, {"bridge_version": 1})
    assert validated.pop("koboldcpp", bridge_agent=VALIDATED).json()["id"] is not None

    # Without the flag (the AI Horde's parser leaves it false) any bridge serves it.
    assert requester.request_text().status_code == 202
    assert owner.pop("own-script", bridge_agent=OWN_SCRIPT).json()["id"] is not None


def test_a_bridge_is_matched_by_the_name_of_a_full_bridge_agent(requester, owner, make_caller):
    # `name:version:url`, as the AI Horde parses it: a bare name is no validated bridge.
    bare = make_caller()
    bare.pop("bare", bridge_agent="KoboldCppEmbedWorker")
    owner.pop("regen", bridge_agent="AI Horde Worker reGen:9.0.0:https://github.com/Haidra-Org")
    requester.request_text(validated_backends=True)
    assert bare.pop("bare", bridge_agent="KoboldCppEmbedWorker").json()["skipped"] == {"bridge_version": 1}
    # reGen is the AI Horde's image worker: not in its list of validated text backends.
    regen = "AI Horde Worker reGen:9.0.0:https://github.com/Haidra-Org"
    assert owner.pop("regen", bridge_agent=regen).json()["id"] is None
    assert owner.pop("regen", bridge_agent="AI Horde Worker~aphrodite~oai:4:x").json()["id"] is not None


def test_the_validated_list_is_a_setting(requester, owner, settings):
    settings.VALIDATED_BRIDGE_AGENTS = ["my-own-script"]
    owner.pop("own-script", bridge_agent=OWN_SCRIPT)
    requester.request_text(validated_backends=True)
    assert owner.pop("own-script", bridge_agent=OWN_SCRIPT).json()["id"] is not None


def test_with_no_bridge_validated_a_validated_backends_request_is_refused_at_once(requester, settings):
    settings.VALIDATED_BRIDGE_AGENTS = []
    refused = requester.request_text(validated_backends=True)
    assert refused.status_code == 400
    assert refused.json()["rc"] == "NoValidatedBackends" and set(refused.json()) == {"message", "rc"}
    assert not TextRequest.objects.exists()
    assert requester.request_text(validated_backends="yes").status_code == 400


def test_a_validated_backends_request_with_only_other_bridges_online_is_queued_with_the_warning(
    requester, owner, make_caller
):
    owner.pop("own-script", bridge_agent=OWN_SCRIPT)
    queued = requester.request_text(validated_backends=True)
    assert queued.status_code == 202
    assert queued.json()["message"].startswith("Warning: No available workers can fulfill this request.")
    status = requester.status(queued.json()["id"]).json()
    assert (status["is_possible"], status["eligible_workers"]) == (False, 0)

    make_caller().pop("koboldcpp", bridge_agent=VALIDATED)
    status = requester.status(queued.json()["id"]).json()
    assert (status["is_possible"], status["eligible_workers"]) == (True, 1)


def test_a_waiting_pop_is_woken_for_a_validated_backends_job_only_by_a_validated_bridge():
    offer = Offer(models=("m1",), chat=False, max_length=80, max_context_length=1024, jobs=1, validated=True)
    other = Waiter(models=frozenset({"m1"}), chat=False, max_length=512, max_context_length=2048)
    validated = Waiter(
        models=frozenset({"m1"}), chat=False, max_length=512, max_context_length=2048, validated=True
    )
    assert (other.can_take(offer), validated.can_take(offer)) == (False, True)
    assert other.can_take(Offer(models=("m1",), chat=False, max_length=80, max_context_length=1024, jobs=1))


def test_a_request_that_disables_batching_gives_a_pop_one_job_at_a_time(make_caller, owner):
    trusted = make_caller(trusted=True)
    owner.pop("batcher", amount=3)
    queued = trusted.request_text(params={"n": 3, "max_length": 80}, disable_batching=True)
    assert queued.status_code == 202, queued.json()
    for left in (2, 1, 0):
        job = owner.pop("batcher", amount=3).json()
        assert len(job["ids"]) == 1
        assert TextRequest.objects.get().queued == left
    assert Generation.objects.count() == 3

    # Batched (the default), one pop takes as many as it asks for.
    trusted.request_text(params={"n": 3, "max_length": 80})
    assert len(owner.pop("batcher", amount=3).json()["ids"]) == 3


def test_only_a_trusted_account_may_disable_batching_of_more_than_one_job(requester):
    refused = requester.request_text(params={"n": 2, "max_length": 80}, disable_batching=True)
    assert refused.status_code == 400
    assert refused.json() == {"message": "Only trusted users can disable batching.", "rc": "RequiresTrust"}
    assert not TextRequest.objects.exists()
    # One job is never batched: nothing to refuse.
    assert requester.request_text(disable_batching=True).status_code == 202


def test_a_service_accounts_request_records_the_account_it_was_sent_for(make_caller):
    service = make_caller("front-end")
    Account.objects.filter(pk=service.account.pk).update(service=True)
    queued = service.request_text(proxied_account="reader#42")
    assert queued.status_code == 202, queued.json()
    assert TextRequest.objects.get(pk=queued.json()["id"]).proxied_account == "reader#42"
    # Not sent: sent for no one.
    assert TextRequest.objects.get(pk=service.request_text().json()["id"]).proxied_account == ""


def test_an_account_that_is_no_service_account_cannot_send_a_proxied_account(requester):
    refused = requester.request_text(proxied_account="reader#42")
    assert refused.status_code == 400
    assert refused.json() == {
        "message": "Only service accounts can provide a proxied_account value.",
        "rc": "OnlyServiceAccountProxy",
    }
    assert not TextRequest.objects.exists()
    assert requester.request_text(proxied_account="").status_code == 202  # empty: none, as on the AI Horde
    assert requester.request_text(proxied_account="x" * 256).status_code == 400
