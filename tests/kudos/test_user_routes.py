"""GET /api/v2/find_user and /api/v2/users/{id}: an account as the AI Horde shows a user, its kudos
from its wallets."""

from workers.models import Account


def test_find_user_shows_the_keys_own_account_with_its_workers_and_contributions(requester, owner):
    owner.pop("w-one", models=["m1"])
    owner.pop("w-two", models=["m1"])
    requester.request_text(models=["m1"], params={"max_length": 64})
    job = owner.pop("w-one", models=["m1"]).json()
    assert owner.submit(job["id"], "x" * 400).status_code == 200  # 100 tokens

    found = owner.client.get("/api/v2/find_user", HTTP_APIKEY=owner.api_key)
    assert found.status_code == 200
    user = found.json()
    assert user["username"] == f"owner#{owner.account.id}" and user["id"] == owner.account.id
    assert user["worker_count"] == 2
    assert sorted(user["worker_ids"]) == sorted(str(w.id) for w in owner.account.workers.all())
    # The AI Horde's records: the tokens paid for (at most the 64 asked) and the jobs.
    assert user["records"]["contribution"] == {"megapixelsteps": 0, "tokens": 64}
    assert user["records"]["fulfillment"] == {"image": 0, "text": 1, "interrogation": 0}
    assert user["records"]["usage"]["tokens"] == user["records"]["request"]["text"] == 0
    asked = requester.client.get("/api/v2/find_user", HTTP_APIKEY=requester.api_key).json()["records"]
    assert (asked["usage"]["tokens"], asked["request"]["text"], asked["contribution"]["tokens"]) == (64, 1, 0)
    # An unknown model earns an untrusted worker the context multiplier alone (a 20-token context:
    # 1.2 + 2.2 ^ log2(20 / 1,024) = 1.21), half of it held in escrow (shown to moderators only).
    # The 0.61 paid raised a new account to the floor of 25.
    assert (user["kudos"], user["kudos_details"]["accumulated"]) == (25, 0.61)
    assert set(user["kudos_details"]) == {
        "accumulated", "gifted", "donated", "admin", "received", "recurring", "awarded", "styled"
    }  # fmt: skip
    assert "evaluating_kudos" not in user
    assert (user["trusted"], user["moderator"], user["concurrency"]) == (False, False, 30)


def test_find_user_needs_a_valid_key(requester):
    assert requester.client.get("/api/v2/find_user").json()["rc"] == "InvalidAPIKey"
    unknown = requester.client.get("/api/v2/find_user", HTTP_APIKEY="no-such-key-000000000")
    assert (unknown.status_code, unknown.json()["rc"]) == (401, "InvalidAPIKey")


def test_a_users_details_are_public_but_its_worker_ids_are_shown_only_to_itself_and_moderators(
    requester, owner, make_caller
):
    owner.pop("w-one")
    path = f"/api/v2/users/{owner.account.id}"
    public = requester.client.get(path, HTTP_APIKEY=requester.api_key).json()
    assert public["username"] == f"owner#{owner.account.id}" and public["worker_count"] == 1
    assert "worker_ids" not in public
    assert "worker_ids" in owner.client.get(path, HTTP_APIKEY=owner.api_key).json()
    moderator = make_caller("a-moderator")
    Account.objects.filter(pk=moderator.account.pk).update(moderator=True)
    seen_by_moderator = moderator.client.get(path, HTTP_APIKEY=moderator.api_key).json()
    assert "worker_ids" in seen_by_moderator and seen_by_moderator["evaluating_kudos"] == 0
    assert "worker_ids" not in requester.client.get(path).json()  # no key: the public view


def test_an_unknown_or_malformed_user_id_is_UserNotFound(requester):
    # '²' and '①' pass str.isdigit() and fail int(): each was a 500 on this keyless route.
    for user_id in ("999999", "abc", "-1", "", "9" * 30, "²", "①", "١", "1²", "9" * 4301):
        answer = requester.client.get(f"/api/v2/users/{user_id}")
        assert (answer.status_code, answer.json()["rc"]) == (404, "UserNotFound"), user_id


def test_an_account_serving_its_own_request_keeps_both_records_though_its_kudos_net_out(owner):
    owner.request_text(models=["m1"], params={"max_length": 40})
    job = owner.pop("w-one", models=["m1"]).json()
    assert owner.submit(job["id"], "x" * 100).status_code == 200  # 25 tokens

    records = owner.client.get("/api/v2/find_user", HTTP_APIKEY=owner.api_key).json()["records"]
    assert (records["usage"]["tokens"], records["request"]["text"]) == (25, 1)
    assert (records["contribution"]["tokens"], records["fulfillment"]["text"]) == (25, 1)
