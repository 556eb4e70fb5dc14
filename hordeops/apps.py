from django.contrib.admin.apps import AdminConfig


class HordeAdminConfig(AdminConfig):
    """Django's admin, with the horde's own site (the operations page) as the default."""

    default_site = "hordeops.admin.HordeAdminSite"

    def ready(self) -> None:
        super().ready()
        from django.contrib.auth.signals import user_logged_in, user_login_failed

        from hordeops import logins

        user_login_failed.connect(logins.on_login_failed, dispatch_uid="hordeops.logins.failed")
        user_logged_in.connect(logins.on_logged_in, dispatch_uid="hordeops.logins.logged_in")
