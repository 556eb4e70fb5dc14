from django.apps import AppConfig
from django.contrib.admin import apps as admin_apps


class FrontConfig(AppConfig):
    """The top floor: what people face (the admin site, its moderation pages), above the apps."""

    name = "front"
    verbose_name = "Moderation"
    default = True


class HordeAdminConfig(admin_apps.AdminConfig):
    """Django's admin, with the horde's own site (the operations page) as the default."""

    default = False
    default_site = "front.site.HordeAdminSite"

    def ready(self) -> None:
        super().ready()
        self._without_allauths_pages()
        from django.contrib.auth.signals import user_logged_in, user_login_failed

        from hordeops import logins

        user_login_failed.connect(logins.on_login_failed, dispatch_uid="hordeops.logins.failed")
        user_logged_in.connect(logins.on_logged_in, dispatch_uid="hordeops.logins.logged_in")

    def _without_allauths_pages(self) -> None:
        # allauth's own models (emails, tokens, apps kept in the database) are not used here, and
        # an identity is seen through its account: every page of this site is the front app's.
        from allauth.account.models import EmailAddress
        from allauth.socialaccount.models import SocialAccount, SocialApp, SocialToken
        from django.contrib import admin

        for model in (EmailAddress, SocialAccount, SocialApp, SocialToken):
            if admin.site.is_registered(model):
                admin.site.unregister(model)
