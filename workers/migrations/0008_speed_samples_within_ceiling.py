"""Bring speeds measured before the ceiling on a speed sample (jobs/claims.py) within it.

One job submitted with a huge claimed token count made a worker's speed, and so its capacity,
overflow the pop's integer column; the samples it left would have kept it there for 20 jobs.
"""

from django.conf import settings
from django.db import migrations

CLAMP = """
    UPDATE {table} SET
        speed_samples = ARRAY(SELECT least(x, %(ceiling)s) FROM unnest(speed_samples) AS x),
        speed = coalesce(
            (SELECT avg(least(x, %(ceiling)s)) FROM unnest(speed_samples) AS x), least(speed, %(ceiling)s)
        )
    WHERE speed > %(ceiling)s OR EXISTS (SELECT 1 FROM unnest(speed_samples) AS x WHERE x > %(ceiling)s)
"""


def clamp(apps, schema_editor):
    table = apps.get_model("workers", "Worker")._meta.db_table
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(
            CLAMP.format(table=table), {"ceiling": float(settings.TEXT_WORKER_MAX_TOKENS_PER_SECOND)}
        )


class Migration(migrations.Migration):
    dependencies = [("workers", "0007_discovery_fields")]

    operations = [migrations.RunPython(clamp, migrations.RunPython.noop)]
