from django.db import migrations

from workers.moderation import regrant_moderators


def moderators_see_shared_keys(apps, schema_editor):
    regrant_moderators(apps)


class Migration(migrations.Migration):
    # After every migration that makes a permission the group holds: it sets them all.
    dependencies = [
        ("workers", "0025_account_user"),
        ("jobs", "0018_requests_by_account_recent"),
        ("kudos", "0006_award_permission"),
    ]

    operations = [migrations.RunPython(moderators_see_shared_keys, migrations.RunPython.noop)]
