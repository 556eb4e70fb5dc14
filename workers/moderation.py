"""What the "Moderators" group may do: view everything of hordeops, change accounts and workers.

The admin narrows "change" to trust, the account deadline limit and maintenance. Used by the
migration that creates the group (with the historical models) and by tests.
"""

MODERATORS = "Moderators"
PERMISSIONS = (
    ("workers", "view_account"),
    ("workers", "change_account"),
    ("workers", "view_worker"),
    ("workers", "change_worker"),
    ("jobs", "view_textrequest"),
    ("jobs", "view_generation"),
)


def grant_moderators(group_model, permission_model):
    """Create the group (if missing) with exactly these permissions; return it."""
    group, _ = group_model.objects.get_or_create(name=MODERATORS)
    group.permissions.set(
        permission_model.objects.get(content_type__app_label=app, codename=codename)
        for app, codename in PERMISSIONS
    )
    return group
