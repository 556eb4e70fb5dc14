"""Connection settings the pop relies on."""

from django.db import connection


def test_connections_run_without_jit(db):
    # The pop is a ~1 ms indexed query whose cost estimate crosses jit_above_cost; compiling
    # it each time would cost tens to hundreds of milliseconds (bench/studies/pop_scale.py).
    with connection.cursor() as cursor:
        cursor.execute("SHOW jit")
        assert cursor.fetchone() == ("off",)
