"""Styles and collections in the admin (`front/admin/styles.py`), and the customizer role on the
account page: moderators give the role, list styles, unlist or mark one NSFW, and delete it."""

from tests.conftest import ACCOUNT_PAGE_INLINES
from workers import styles
from workers.models import Account, Style, StyleCollection

LIST = "/admin/workers/style/"


def test_a_moderator_gives_the_customizer_role_and_the_account_may_then_make_styles(moderator, owner):
    refused = owner.post("/api/v2/styles/text", {"name": "noir", "models": ["m1"]})
    assert refused.status_code == 403 and refused.json()["rc"] == "StylesRequiresCustomizer"
    page = f"/admin/workers/account/{owner.account.pk}/change/"
    assert 'name="customizer"' in moderator.get(page).content.decode()
    moderator.post(page, {**ACCOUNT_PAGE_INLINES, "customizer": "on", "max_waiting_requests": ""})
    assert Account.objects.get(pk=owner.account.pk).customizer is True
    assert owner.post("/api/v2/styles/text", {"name": "noir", "models": ["m1"]}).status_code == 200


def test_a_moderator_lists_unlists_and_deletes_a_style_but_cannot_rewrite_it(moderator, trusted_owner):
    style = styles.create_style(caller=trusted_owner.account, name="noir", prompt="Noir: {p}", models=["m1"])
    collection = styles.create_collection(caller=trusted_owner.account, name="moods", styles=["noir"])
    listed = moderator.get(LIST).content.decode()
    assert ">noir</a>" in listed and "trusted-owner" in listed
    page = f"{LIST}{style.pk}/change/"
    moderator.post(page, {"nsfw": "on", "prompt": "Rewritten: {p}", "name": "mine"})
    style.refresh_from_db()
    assert (style.public, style.nsfw, style.prompt, style.name) == (False, True, "Noir: {p}", "noir")
    assert moderator.get(f"/admin/workers/stylecollection/{collection.pk}/change/").status_code == 200
    assert moderator.post(f"{LIST}{style.pk}/delete/", {"post": "yes"}).status_code == 302
    assert not Style.objects.exists() and list(StyleCollection.objects.get().styles.all()) == []
