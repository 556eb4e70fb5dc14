from django.db import migrations

from workers.moderation import regrant_moderators


def moderators_write_news(apps, schema_editor):
    regrant_moderators(apps)


class Migration(migrations.Migration):
    # After every migration that makes a permission the group holds: it sets them all.
    dependencies = [
        ("front", "0001_news_and_documents"),
        ("workers", "0026_moderators_see_shared_keys"),
        ("jobs", "0023_warm_worker"),
        ("kudos", "0009_holds"),
    ]

    operations = [migrations.RunPython(moderators_write_news, migrations.RunPython.noop)]
