"""JIT off for the whole database, not only for the connections that ask for it.

Each connection asks (`-c jit=off` in its startup options: hordeops/settings.py), but a pooler in
transaction mode (PgBouncer) must be told to drop startup options, and then the pop would be
compiled on every call again. Set on the database, it holds for every session however it comes.
"""

from django.db import migrations

JIT_OFF = "DO $$ BEGIN EXECUTE format('ALTER DATABASE %I SET jit = off', current_database()); END $$"
JIT_DEFAULT = "DO $$ BEGIN EXECUTE format('ALTER DATABASE %I RESET jit', current_database()); END $$"


class Migration(migrations.Migration):
    dependencies = [("jobs", "0018_requests_by_account_recent")]

    operations = [migrations.RunSQL(JIT_OFF, JIT_DEFAULT)]
