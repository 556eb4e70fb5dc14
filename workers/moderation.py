"""What the "Moderators" group may do: view everything of hordeops, change accounts and workers,
keep the kudos model table, award kudos, delete shared keys, rename and delete teams, unlist and
delete styles and their collections, and write the horde's news.

The admin narrows "change" to trust, the account deadline limit and maintenance. Used by the
migration that creates the group (with the historical models) and by tests.
"""

from django.db.models import Q

MODERATORS = "Moderators"
PERMISSIONS = (
    ("workers", "view_account"),
    ("workers", "change_account"),
    ("workers", "view_worker"),
    ("workers", "change_worker"),
    ("workers", "view_hordemodes"),
    ("workers", "change_hordemodes"),
    ("workers", "view_addresstimeout"),
    ("workers", "add_addresstimeout"),
    ("workers", "change_addresstimeout"),
    ("workers", "delete_addresstimeout"),
    ("workers", "view_suspicion"),
    ("workers", "view_workermessage"),
    ("workers", "add_workermessage"),
    ("workers", "change_workermessage"),
    ("workers", "delete_workermessage"),
    ("workers", "view_sharedkey"),
    ("workers", "delete_sharedkey"),
    # As on the AI Horde, a moderator may rename or delete any team.
    ("workers", "view_team"),
    ("workers", "change_team"),
    ("workers", "delete_team"),
    # As on the AI Horde, a moderator may delete any style or collection; here also unlist one
    # or mark it NSFW.
    ("workers", "view_style"),
    ("workers", "change_style"),
    ("workers", "delete_style"),
    ("workers", "view_stylecollection"),
    ("workers", "change_stylecollection"),
    ("workers", "delete_stylecollection"),
    ("jobs", "view_textrequest"),
    ("jobs", "cancel_textrequest"),
    ("jobs", "view_generation"),
    ("kudos", "view_posting"),
    ("kudos", "view_textmodel"),
    ("kudos", "add_textmodel"),
    ("kudos", "change_textmodel"),
    ("kudos", "delete_textmodel"),
    ("kudos", "award_kudos"),
    # The horde's news (`GET /api/v2/status/news`) is the moderators' to write; its documents
    # (terms, privacy, sponsors) are the operator's, a superuser's: moderators read them.
    ("front", "view_newspiece"),
    ("front", "add_newspiece"),
    ("front", "change_newspiece"),
    ("front", "delete_newspiece"),
    ("front", "view_hordedocument"),
)


def grant_moderators(group_model, permission_model):
    """Create the group (if missing) with exactly these permissions; return it."""
    group, _ = group_model.objects.get_or_create(name=MODERATORS)
    # Those that exist yet: an earlier migration grants its apps', a later one the rest.
    wanted = Q()
    for app, codename in PERMISSIONS:
        wanted |= Q(content_type__app_label=app, codename=codename)
    group.permissions.set(permission_model.objects.filter(wanted))
    return group


def regrant_moderators(apps) -> None:
    """`grant_moderators` from a data migration: permissions are normally created after all
    migrations, and the group needs those of the migrations so far now."""
    from django.contrib.auth.management import create_permissions

    for app_config in apps.get_app_configs():
        app_config.models_module = True
        create_permissions(app_config, apps=apps, verbosity=0)
        app_config.models_module = None
    grant_moderators(apps.get_model("auth", "Group"), apps.get_model("auth", "Permission"))
