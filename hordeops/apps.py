from django.contrib.admin.apps import AdminConfig


class HordeAdminConfig(AdminConfig):
    """Django's admin, with the horde's own site (the operations page) as the default."""

    default_site = "hordeops.admin.HordeAdminSite"
