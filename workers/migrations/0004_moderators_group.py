from django.db import migrations

from workers.moderation import regrant_moderators


def create_moderators(apps, schema_editor):
    regrant_moderators(apps)


class Migration(migrations.Migration):
    dependencies = [
        ("workers", "0003_account_deadline_limit"),
        ("jobs", "0004_deadlines"),
        ("auth", "0012_alter_user_first_name_max_length"),
        ("contenttypes", "0002_remove_content_type_name"),
    ]

    operations = [migrations.RunPython(create_moderators, migrations.RunPython.noop)]
