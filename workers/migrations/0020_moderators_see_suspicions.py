from django.db import migrations

from workers.moderation import regrant_moderators


def moderators_see_suspicions(apps, schema_editor):
    regrant_moderators(apps)


class Migration(migrations.Migration):
    dependencies = [("workers", "0019_worker_messages"), ("jobs", "0018_requests_by_account_recent")]

    operations = [migrations.RunPython(moderators_see_suspicions, migrations.RunPython.noop)]
