from django.db import migrations

from workers.models import ANONYMOUS_API_KEY, ANONYMOUS_NAME, hash_api_key


def create_anonymous(apps, schema_editor):
    Account = apps.get_model("workers", "Account")
    Account.objects.get_or_create(
        name=ANONYMOUS_NAME, defaults={"api_key_hash": hash_api_key(ANONYMOUS_API_KEY)}
    )


class Migration(migrations.Migration):
    dependencies = [("workers", "0001_initial")]

    operations = [migrations.RunPython(create_anonymous, migrations.RunPython.noop)]
