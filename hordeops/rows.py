"""Model instances from hand-written SQL, for the statements every pop runs.

`Model.objects.raw()` works out, on every call, which cursor column is which field: it reads
the cursor's description (an object per column), maps names to fields and looks up each
field's converters; on a pop's three statements that was about a tenth of the web process's
CPU. Here the statement lists the columns itself, in the model's field order (`columns`),
so that mapping is worked out once per model.
"""

from collections.abc import Mapping, Sequence
from functools import cache
from typing import Any, TypeVar

from django.db import connection
from django.db.models import Model

M = TypeVar("M", bound=Model)


@cache
def columns(model: type[Model], alias: str = "") -> str:
    """The model's concrete columns in field order, for a SELECT or RETURNING list."""
    prefix = f"{alias}." if alias else ""
    # Quoted as PostgreSQL quotes identifiers, without asking a connection: this runs while
    # modules build their statements, before any database is configured.
    return ", ".join(f'{prefix}"{field.column}"' for field in model._meta.concrete_fields)


def fetch_instance(
    model: type[M], sql: str, params: Sequence[Any] | Mapping[str, Any], *, extra: Sequence[str] = ()
) -> M | None:
    """The first row of `sql` as an instance of `model`, or None.

    The statement's columns are `columns(model)` then one per name in `extra`, which are set
    as attributes (as `raw()` sets annotations).
    """
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        row = cursor.fetchone()
    if row is None:
        return None
    attnames, converters = _shape(model)
    values = list(row[: len(attnames)])
    for index, expression, functions in converters:
        for function in functions:
            values[index] = function(values[index], expression, connection)
    instance = model.from_db(connection.alias, attnames, values)
    for name, value in zip(extra, row[len(attnames) :], strict=True):
        setattr(instance, name, value)
    return instance


@cache
def _shape(model: type[Model]) -> tuple[list[str], list[tuple[int, Any, tuple]]]:
    """The field attnames in column order, and the converters of the fields that have any
    (a JSONField's decoding, say), as the ORM's compiler would apply them."""
    fields = model._meta.concrete_fields
    converters = []
    for index, field in enumerate(fields):
        expression = field.get_col(model._meta.db_table)
        functions = (*connection.ops.get_db_converters(expression), *expression.get_db_converters(connection))
        if functions:
            converters.append((index, expression, functions))
    return [field.attname for field in fields], converters
