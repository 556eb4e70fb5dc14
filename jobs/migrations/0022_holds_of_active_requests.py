from django.db import migrations


class Migration(migrations.Migration):
    """The holds of the requests active now: what each still keeps of its account's kudos was
    computed from its row until now, and is kept by the ledger app from now on."""

    dependencies = [
        ("jobs", "0021_generation_relayed_bytes"),
        ("kudos", "0009_holds"),
    ]

    operations = [
        migrations.RunSQL(
            """
            INSERT INTO kudos_hold (request_id, account_id, amount)
            SELECT id, account_id, GREATEST(kudos_reserved - kudos_spent, 0) FROM jobs_textrequest
            WHERE state = 'active'
            ON CONFLICT (request_id) DO NOTHING
            """,
            reverse_sql="DELETE FROM kudos_hold",
        ),
    ]
