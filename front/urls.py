"""The pages people use (not the admin's): each page's route, added by the page's module."""

from django.urls import path

from front import account, oauth, pages, shared_keys, signup

app_name = "front"

urlpatterns = [
    path("", pages.home, name="home"),
    path("account", account.account_page, name="account"),
    path("account/sign-out", account.sign_out, name="sign-out"),
    path("account/reset", account.reset_key, name="reset-key"),
    path("account/transfer", account.transfer, name="transfer"),
    path("account/workers/<uuid:worker_id>/maintenance", account.worker_maintenance, name="maintenance"),
    path("account/oauth", oauth.signed_in, name="oauth-signed-in"),
    path("account/shared-keys", shared_keys.create, name="shared-key-create"),
    path("account/shared-keys/<uuid:key_id>/edit", shared_keys.edit, name="shared-key-edit"),
    path("account/shared-keys/<uuid:key_id>/delete", shared_keys.delete, name="shared-key-delete"),
    path("register", signup.register, name="register"),
]
