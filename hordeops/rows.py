"""Model instances from hand-written SQL, for the statements the hot worker routes run.

`Model.objects.raw()` works out, on every call, which cursor column is which field: it reads
the cursor's description (an object per column), maps names to fields and looks up each
field's converters; on a pop's three statements that was about a tenth of the web process's
CPU. The ORM's querysets cost more still (compiling a three-table select_related was most of
a progress post's). Here the statement lists the columns itself, in the model's field order
(`columns`), so that mapping is worked out once per model and field list.
"""

import re
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from functools import cache
from typing import Any, TypeVar

from django.db import connection
from django.db.models import Model

M = TypeVar("M", bound=Model)
Fields = tuple[str, ...] | None  # a subset of a model's fields, or None for all of them


@cache
def columns(model: type[Model], alias: str = "", fields: Fields = None) -> str:
    """The model's concrete columns (or those of `fields`) in field order, for a SELECT or
    RETURNING list. Fields left out are deferred: reading one costs a query."""
    prefix = f"{alias}." if alias else ""
    # Quoted as PostgreSQL quotes identifiers, without asking a connection: this runs while
    # modules build their statements, before any database is configured.
    return ", ".join(f'{prefix}"{field.column}"' for field in _fields(model, fields))


# A type's length, left out of a cast: a cast to varchar(n) cuts a longer value, which the
# INSERT would refuse.
_LENGTH = re.compile(r"\(\d+\)")


def insert_columns(model: type[Model], exclude: tuple[str, ...] = ()) -> tuple[str, str]:
    """The concrete columns of an INSERT of `model` but `exclude` (attnames), and their values as
    named placeholders (`insert_values`), each cast to its column's type: an INSERT ... SELECT
    does not give its placeholders the target's types, and a NULL would be text."""
    chosen = [field for field in model._meta.concrete_fields if field.attname not in exclude]
    names = ", ".join(f'"{field.column}"' for field in chosen)
    values = ", ".join(
        f"%({field.attname})s::{_LENGTH.sub('', field.cast_db_type(connection))}" for field in chosen
    )
    return names, values


def insert_values(instance: Model, exclude: tuple[str, ...] = ()) -> dict[str, Any]:
    """The instance's concrete fields but `exclude`, by attname, as the ORM's INSERT sends them."""
    return {
        field.attname: field.get_db_prep_save(field.pre_save(instance, True), connection)
        for field in instance._meta.concrete_fields
        if field.attname not in exclude
    }


def fetch_instance(
    model: type[M],
    sql: str,
    params: Sequence[Any] | Mapping[str, Any],
    *,
    extra: Sequence[str] = (),
    generic_plan: bool = False,
) -> M | None:
    """The first row of `sql` as an instance of `model`, or None.

    The statement's columns are `columns(model)` then one per name in `extra`, which are set
    as attributes (as `raw()` sets annotations). `generic_plan`: see `_first_generic_row`.
    """
    row = _first_generic_row(sql, params) if generic_plan else _first_row(sql, params)
    if row is None:
        return None
    instance = _instance(model, None, row, 0)
    width = len(_shape(model, None)[0])
    for name, value in zip(extra, row[width:], strict=True):
        setattr(instance, name, value)
    return instance


def fetch_instances(
    sql: str, params: Sequence[Any] | Mapping[str, Any], *parts: tuple[type[Model], Fields]
) -> list[Model | None] | None:
    """The first row of `sql` as one instance per (model, fields) part, or None.

    The statement's columns are `columns(model, alias, fields)` of each part, in order. A
    part whose primary key is NULL (an outer join that found nothing) is None.
    """
    row = _first_row(sql, params)
    if row is None:
        return None
    instances, offset = [], 0
    for model, fields in parts:
        attnames = _shape(model, fields)[0]
        present = row[offset + attnames.index(model._meta.pk.attname)] is not None
        instances.append(_instance(model, fields, row, offset) if present else None)
        offset += len(attnames)
    if offset != len(row):
        raise ValueError(f"The statement returned {len(row)} columns, the parts name {offset}.")
    return instances


def _first_row(sql: str, params: Sequence[Any] | Mapping[str, Any]) -> tuple | None:
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchone()


# Sent in one pipeline with the statement after it: no Sync between them, so they share an
# implicit transaction and the setting ends with the statement. `set_config(..., true)` is SET
# LOCAL without its warning there ("can only be used in transaction blocks", in the server log
# at every pop), though it holds all the same.
_GENERIC_PLAN = "SELECT set_config('plan_cache_mode', 'force_generic_plan', true)"


def _first_generic_row(sql: str, params: Sequence[Any] | Mapping[str, Any]) -> tuple | None:
    """`_first_row`, with a prepared statement's generic plan used from the first run it is
    prepared, in the same round trip.

    PostgreSQL plans a prepared statement anew at each run unless its generic plan is
    estimated cheaper than the custom plans so far, which a long statement's rarely is on a
    short queue: planning then costs more than running it. `plan_cache_mode` chooses for it,
    but is a session's setting; set LOCAL just before the statement, it holds for that one.
    In a transaction block it would hold to the block's end, so there the statement runs as is.
    """
    if connection.in_atomic_block:
        return _first_row(sql, params)
    with pipelined() as cursor:
        cursor.execute(_GENERIC_PLAN)
        cursor.execute(sql, params)
        return cursor.fetchone()


@contextmanager
def pipelined() -> Iterator[Any]:
    """A cursor whose statements go to PostgreSQL together, in one round trip (a psycopg
    pipeline), up to the first fetch. Its errors are Django's, whichever call raises them: the
    pipeline's exit can, outside the cursor's own wrapping."""
    with connection.cursor() as cursor, connection.wrap_database_errors, connection.connection.pipeline():
        yield cursor


def _instance(model: type[M], fields: Fields, row: tuple, offset: int) -> M:
    attnames, converters = _shape(model, fields)
    values = list(row[offset : offset + len(attnames)])
    for index, expression, functions in converters:
        for function in functions:
            values[index] = function(values[index], expression, connection)
    return model.from_db(connection.alias, attnames, values)


def _fields(model: type[Model], fields: Fields) -> list:
    """The concrete fields, all or those named, in the model's order (as from_db needs)."""
    concrete = model._meta.concrete_fields
    if fields is None:
        return list(concrete)
    unknown = set(fields) - {field.name for field in concrete}
    if unknown:
        raise ValueError(f"{model.__name__} has no concrete fields {sorted(unknown)}.")
    return [field for field in concrete if field.name in fields or field.primary_key]


@cache
def _shape(model: type[Model], fields: Fields) -> tuple[list[str], list[tuple[int, Any, tuple]]]:
    """The attnames in column order, and the converters of the fields that have any (a
    JSONField's decoding, say), as the ORM's compiler would apply them."""
    chosen = _fields(model, fields)
    converters = []
    for index, field in enumerate(chosen):
        expression = field.get_col(model._meta.db_table)
        functions = (*connection.ops.get_db_converters(expression), *expression.get_db_converters(connection))
        if functions:
            converters.append((index, expression, functions))
    return [field.attname for field in chosen], converters
