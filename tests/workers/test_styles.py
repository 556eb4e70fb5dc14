"""Text styles and collections (`/api/v2/styles/text`, `/styles/text/{id}`,
`/styles/text_by_name/{name}`, `/collections`, `/collections/{id}`, `/collection_by_name/{name}`),
as the AI Horde rules them (`workers/styles.py`, routes `jobs/style_views.py`): who makes, reads,
changes and deletes them, and each refusal in the horde's `{"message", "rc"}`."""

import uuid
from urllib.parse import quote

import pytest
from rest_framework.test import APIClient

from workers.models import Account, Style, StyleCollection

STYLE = {
    "name": "noir",
    "info": "Dark, brooding vibes",
    "prompt": "Write it as a hard-boiled detective would: {p}",
    "params": {"max_length": 120, "temperature": 0.7, "stop_sequence": ["\nYou:"]},
    "models": ["koboldcpp/noir-13B", "koboldcpp/noir-7B"],
    "tags": ["dark", "prose"],
}

# No style or collection has it; fixed, so that test ids are the same in every xdist worker.
UNKNOWN_ID = "6f1d3c1e-8b7a-4e53-9c1a-2b9d0e7f4a10"


def _send(caller, method: str, path: str, body=None):
    return getattr(caller.client, method)(f"/api/v2/{path}", body, format="json", HTTP_APIKEY=caller.api_key)


def _make(caller, **body):
    return _send(caller, "post", "styles/text", {**STYLE, **body})


def _refused(response, status: int, rc: str) -> dict:
    body = response.json()
    assert response.status_code == status, body
    assert set(body) <= {"message", "rc", "errors"} and body["rc"] == rc and body["message"], body
    return body


@pytest.fixture
def customizer(make_caller):
    caller = make_caller("customizer")
    Account.objects.filter(pk=caller.account.pk).update(customizer=True)
    caller.account.customizer = True
    return caller


@pytest.fixture
def style(trusted_owner) -> str:
    made = _make(trusted_owner)
    assert made.status_code == 200, made.content
    return made.json()["id"]


def test_a_trusted_account_makes_a_style_and_anyone_reads_it_by_id_by_name_and_in_the_list(
    trusted_owner, style
):
    made = Style.objects.get()
    alias = f"trusted-owner#{trusted_owner.account.pk}"
    shown = {
        "name": "noir",
        "info": "Dark, brooding vibes",
        "prompt": STYLE["prompt"],
        "params": STYLE["params"],
        "public": True,
        "nsfw": False,
        "tags": ["dark", "prose"],
        "models": STYLE["models"],
        "id": str(made.pk),
        "use_count": 0,
        "creator": alias,
    }
    anyone = APIClient()
    assert anyone.get(f"/api/v2/styles/text/{style}").json() == shown
    for name in ("noir", f"{alias}::noir", f"style::{alias}::noir", "style::noir"):
        by_name = anyone.get(f"/api/v2/styles/text_by_name/{quote(name)}")
        assert by_name.status_code == 200 and by_name.json() == shown, name
    assert anyone.get("/api/v2/styles/text").json() == [shown]
    assert anyone.get("/api/v2/styles/text?tag=dark&model=koboldcpp/noir-7B&sort=age").json() == [shown]
    assert anyone.get("/api/v2/styles/text?tag=light").json() == []
    assert anyone.get("/api/v2/styles/text?page=2").json() == []
    # The account's details list its styles, by their unique name.
    user = anyone.get(f"/api/v2/users/{trusted_owner.account.pk}").json()
    assert user["styles"] == [{"name": f"{alias}::style::noir", "id": str(made.pk), "type": "text"}]


def test_a_customizer_makes_a_style_with_the_ai_hordes_default_prompt(customizer):
    made = _send(customizer, "post", "styles/text", {"name": "plain", "models": ["m1"]})
    assert made.status_code == 200, made.content
    assert made.json() == {"id": made.json()["id"], "message": "OK"}
    style = Style.objects.get()
    assert (style.prompt, style.params, style.info, style.tags) == ("{p}{np}", {}, "", [])
    assert APIClient().get("/api/v2/find_user", HTTP_APIKEY=customizer.api_key).json()["customizer"] is True


def test_an_untrusted_account_anonymous_and_no_key_cannot_make_a_style(owner, anonymous):
    _refused(_make(owner), 403, "StylesRequiresCustomizer")
    Account.objects.filter(pk=anonymous.account.pk).update(trusted=True)
    _refused(_make(anonymous), 403, "StylesAnonForbidden")
    _refused(APIClient().post("/api/v2/styles/text", STYLE, format="json"), 401, "InvalidAPIKey")
    assert not Style.objects.exists()


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ({"models": ["a", "b", "c", "d", "e", "f"]}, "A style can only use a maximum of 5 models."),
        ({"models": []}, "A style has to specify at least one model."),
        ({"models": None}, "A style has to specify at least one model."),
        ({"tags": [f"t{i}" for i in range(11)]}, "A style can be tagged a maximum of 10 times."),
    ],
)
def test_a_style_over_the_ai_hordes_limits_is_refused_in_its_words(trusted_owner, body, words):
    assert _refused(_make(trusted_owner, **body), 400, "BadRequest")["message"] == words
    assert not Style.objects.exists()


def test_a_style_prompt_needs_p_and_a_template_the_horde_can_fill(trusted_owner):
    _refused(_make(trusted_owner, prompt="No place for the prompt"), 400, "StylePromptMissingVars")
    for template in ("{p} {", "{p} }", "{p} {0}", "{p} {p.upper}", "{p} {p!r}", "{p} {p:>30}", "{p} {x[0]}"):
        _refused(_make(trusted_owner, prompt=template), 400, "StylePromptInvalid")
    assert _make(trusted_owner, prompt="{{literal}} {p} {unknown}").status_code == 200


def test_a_style_whose_context_cannot_hold_its_reply_is_refused(trusted_owner):
    _refused(
        _make(trusted_owner, params={"max_length": 512, "max_context_length": 256}), 400, "TokenOverflow"
    )


def test_a_second_style_of_the_same_name_is_refused_but_another_account_may_use_the_name(
    trusted_owner, customizer, style
):
    assert "already exists" in _refused(_make(trusted_owner), 400, "BadRequest")["message"]
    assert _make(customizer).status_code == 200
    assert Style.objects.filter(name="noir").count() == 2


def test_the_fields_the_ai_horde_does_not_have_are_refused_not_ignored(trusted_owner):
    for field, value in (
        ("parameter_policy", {"override": "all"}),
        ("template_fields", [{"name": "caption", "description": "What it shows"}]),
        ("sharedkey", str(uuid.uuid4())),
    ):
        refused = _refused(_make(trusted_owner, **{field: value}), 400, "StyleFieldNotServed")
        assert field in refused["message"]
    assert _make(trusted_owner, parameter_policy=None, template_fields=None).status_code == 200


def test_style_creations_are_limited_to_20_an_hour_per_account(trusted_owner, settings):
    for i in range(20):
        assert _make(trusted_owner, name=f"style {i}").status_code == 200
    _refused(_make(trusted_owner, name="one too many"), 429, "RateLimited")
    assert Style.objects.count() == 20


def test_its_owner_changes_a_style_and_what_the_body_leaves_out_stays(trusted_owner, style):
    changed = _send(
        trusted_owner,
        "patch",
        f"styles/text/{style}",
        {"name": "noir 2", "prompt": "Now noir: {p}", "models": ["m2"], "public": False},
    )
    assert changed.status_code == 200 and changed.json() == {"id": style, "message": "OK"}
    shown = APIClient().get(f"/api/v2/styles/text/{style}").json()
    assert (shown["name"], shown["prompt"], shown["models"], shown["public"]) == (
        "noir 2",
        "Now noir: {p}",
        ["m2"],
        False,
    )
    assert (shown["tags"], shown["params"], shown["info"]) == (STYLE["tags"], STYLE["params"], STYLE["info"])
    # Unlisted, but found by whoever knows its id or name.
    assert APIClient().get("/api/v2/styles/text").json() == []
    assert APIClient().get("/api/v2/styles/text_by_name/noir 2").status_code == 200


def test_a_stranger_cannot_change_a_style_even_a_moderator(trusted_owner, make_caller, style):
    stranger = make_caller("stranger", trusted=True)
    _refused(_send(stranger, "patch", f"styles/text/{style}", {"name": "mine"}), 403, "Forbidden")
    Account.objects.filter(pk=stranger.account.pk).update(moderator=True)
    _refused(_send(stranger, "patch", f"styles/text/{style}", {"name": "mine"}), 403, "Forbidden")
    assert Style.objects.get().name == "noir"


def test_a_change_past_the_limits_or_to_a_taken_name_is_refused(trusted_owner, style):
    _make(trusted_owner, name="taken")
    for body, words in (
        ({"models": list("abcdef")}, "A style can only use a maximum of 5 models."),
        ({"tags": [f"t{i}" for i in range(11)]}, "A style can be tagged a maximum of 10 times."),
    ):
        assert (
            _refused(_send(trusted_owner, "patch", f"styles/text/{style}", body), 400, "BadRequest")[
                "message"
            ]
            == words
        )
    refused = _refused(
        _send(trusted_owner, "patch", f"styles/text/{style}", {"name": "taken"}), 400, "BadRequest"
    )
    assert "already exists" in refused["message"]
    _refused(
        _send(trusted_owner, "patch", f"styles/text/{style}", {"prompt": "no prompt here"}),
        400,
        "StylePromptMissingVars",
    )
    assert Style.objects.get(pk=style).model_names == STYLE["models"]


def test_a_stranger_cannot_delete_a_style_but_its_owner_or_a_moderator_can(
    trusted_owner, make_caller, anonymous
):
    first = _make(trusted_owner).json()["id"]
    second = _make(trusted_owner, name="second").json()["id"]
    stranger = make_caller("stranger")
    _refused(_send(stranger, "delete", f"styles/text/{first}"), 403, "Forbidden")
    _refused(_send(anonymous, "delete", f"styles/text/{first}"), 403, "StylesAnonForbidden")
    assert _send(trusted_owner, "delete", f"styles/text/{first}").json() == {"message": "OK"}
    Account.objects.filter(pk=stranger.account.pk).update(moderator=True)
    assert _send(stranger, "delete", f"styles/text/{second}").json() == {"message": "OK"}
    assert not Style.objects.exists()


@pytest.mark.parametrize("style_id", [UNKNOWN_ID, "not-a-uuid", ""])
def test_an_unknown_style_is_not_found_on_every_route(trusted_owner, style_id):
    for method, body in (("get", None), ("patch", {"name": "x"}), ("delete", None)):
        _refused(_send(trusted_owner, method, f"styles/text/{style_id}", body), 404, "StyleNotFound")
    _refused(APIClient().get(f"/api/v2/styles/text_by_name/{style_id or 'nothing'}"), 404, "StyleNotFound")


def test_a_name_with_an_alias_of_no_account_finds_nothing(style):
    _refused(
        APIClient().get(f"/api/v2/styles/text_by_name/{quote('nobody#999999::noir')}"), 404, "StyleNotFound"
    )


def test_the_list_is_sorted_by_use_then_age_and_refuses_a_bad_sort_or_page(trusted_owner):
    for name in ("a", "b", "c"):
        _make(trusted_owner, name=name)
    Style.objects.filter(name="b").update(use_count=5)
    assert [s["name"] for s in APIClient().get("/api/v2/styles/text").json()] == ["b", "a", "c"]
    assert [s["name"] for s in APIClient().get("/api/v2/styles/text?sort=age").json()] == ["a", "b", "c"]
    _refused(APIClient().get("/api/v2/styles/text?sort=new"), 400, "BadRequest")
    for page in ("0", "-1", "x", "1234567"):
        _refused(APIClient().get(f"/api/v2/styles/text?page={page}"), 400, "BadRequest")


def test_image_styles_are_not_served(trusted_owner):
    for path in ("styles/image", f"styles/image/{uuid.uuid4()}", "styles/image_by_name/x"):
        for method in ("get", "post"):
            _refused(_send(trusted_owner, method, path, {"name": "x"}), 404, "NotFound")
    assert APIClient().get("/api/v2/collections?type=image").json() == []


# --- Collections ------------------------------------------------------------------------------


def _collect(caller, **body):
    return _send(caller, "post", "collections", {"name": "moods", "info": "Some moods", **body})


def test_a_trusted_account_collects_styles_by_id_and_name_and_anyone_reads_the_collection(
    trusted_owner, customizer, style
):
    other = _make(customizer, name="sunny").json()["id"]
    alias = f"customizer#{customizer.account.pk}"
    made = _collect(trusted_owner, styles=[style, f"{alias}::sunny", style])
    assert made.status_code == 200, made.content
    collection = StyleCollection.objects.get()
    assert made.json() == {"id": str(collection.pk), "message": "OK"}
    shown = {
        "id": str(collection.pk),
        "name": "moods",
        "type": "text",
        "info": "Some moods",
        "public": True,
        "styles": [
            {"name": f"trusted-owner#{trusted_owner.account.pk}::style::noir", "id": style},
            {"name": f"{alias}::style::sunny", "id": other},
        ],
        "use_count": 0,
    }
    anyone = APIClient()
    assert anyone.get(f"/api/v2/collections/{collection.pk}").json() == shown
    owner_alias = f"trusted-owner#{trusted_owner.account.pk}"
    for name in ("moods", f"collection::{owner_alias}::moods", f"{owner_alias}::moods"):
        assert anyone.get(f"/api/v2/collection_by_name/{quote(name)}").json() == shown, name
    assert anyone.get("/api/v2/collections").json() == [shown]
    assert anyone.get("/api/v2/collections?type=text&sort=age").json() == [shown]


def test_an_untrusted_account_anonymous_and_no_key_cannot_make_a_collection(owner, anonymous, style):
    _refused(_collect(owner, styles=[style]), 403, "StylesRequiresCustomizer")
    Account.objects.filter(pk=anonymous.account.pk).update(trusted=True)
    _refused(_collect(anonymous, styles=[style]), 403, "StylesAnonForbidden")
    _refused(
        APIClient().post("/api/v2/collections", {"name": "x", "styles": [style]}, format="json"),
        401,
        "InvalidAPIKey",
    )
    assert not StyleCollection.objects.exists()


def test_a_collection_of_no_unknown_or_too_many_styles_is_refused(trusted_owner, style):
    assert "at least 1 style" in _refused(_collect(trusted_owner, styles=[]), 400, "BadRequest")["message"]
    assert (
        "cannot be found"
        in _refused(_collect(trusted_owner, styles=["nothing"]), 400, "BadRequest")["message"]
    )
    too_many = [style] * (StyleCollection.MAX_STYLES + 1)
    assert "at most 100" in _refused(_collect(trusted_owner, styles=too_many), 400, "BadRequest")["message"]
    assert _collect(trusted_owner, styles=[style]).status_code == 200
    assert "already exists" in _refused(_collect(trusted_owner, styles=[style]), 400, "BadRequest")["message"]


def test_its_owner_changes_a_collection_and_a_stranger_cannot(trusted_owner, make_caller, style):
    collection = _collect(trusted_owner, styles=[style]).json()["id"]
    other = _make(trusted_owner, name="other").json()["id"]
    stranger = make_caller("stranger", trusted=True)
    _refused(_send(stranger, "patch", f"collections/{collection}", {"name": "mine"}), 403, "Forbidden")
    too_many = {"styles": [style] * (StyleCollection.MAX_STYLES + 1)}
    _refused(_send(trusted_owner, "patch", f"collections/{collection}", too_many), 400, "BadRequest")
    changed = _send(
        trusted_owner,
        "patch",
        f"collections/{collection}",
        {"name": "moods 2", "styles": [other], "public": False},
    )
    assert changed.json() == {"id": collection, "message": "OK"}
    shown = APIClient().get(f"/api/v2/collections/{collection}").json()
    assert (shown["name"], [s["id"] for s in shown["styles"]], shown["public"]) == ("moods 2", [other], False)
    assert shown["info"] == "Some moods"
    assert APIClient().get("/api/v2/collections").json() == []


def test_a_stranger_cannot_delete_a_collection_but_its_owner_or_a_moderator_can(
    trusted_owner, make_caller, style
):
    first = _collect(trusted_owner, styles=[style]).json()["id"]
    second = _collect(trusted_owner, name="second", styles=[style]).json()["id"]
    stranger = make_caller("stranger")
    _refused(_send(stranger, "delete", f"collections/{first}"), 403, "Forbidden")
    assert _send(trusted_owner, "delete", f"collections/{first}").json() == {"message": "OK"}
    Account.objects.filter(pk=stranger.account.pk).update(moderator=True)
    assert _send(stranger, "delete", f"collections/{second}").json() == {"message": "OK"}
    assert not StyleCollection.objects.exists() and Style.objects.count() == 1


@pytest.mark.parametrize("collection_id", [UNKNOWN_ID, "not-a-uuid"])
def test_an_unknown_collection_is_not_found_on_every_route(trusted_owner, collection_id):
    for method, body in (("get", None), ("patch", {"name": "x"}), ("delete", None)):
        _refused(
            _send(trusted_owner, method, f"collections/{collection_id}", body), 404, "CollectionNotFound"
        )
    _refused(APIClient().get("/api/v2/collection_by_name/nothing"), 404, "CollectionNotFound")


def test_a_deleted_style_leaves_its_collections(trusted_owner, style):
    collection = _collect(trusted_owner, styles=[style]).json()["id"]
    _send(trusted_owner, "delete", f"styles/text/{style}")
    assert APIClient().get(f"/api/v2/collections/{collection}").json()["styles"] == []
