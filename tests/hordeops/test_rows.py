"""hordeops.rows: model instances from hand-written SQL, as the ORM would load them."""

from datetime import timedelta

import pytest
from django.db import DataError, connection
from django.forms.models import model_to_dict
from django.utils import timezone

from hordeops.rows import columns, fetch_instance, fetch_instances, insert_columns, insert_values
from jobs.models import TextRequest
from workers.models import Account

pytestmark = pytest.mark.django_db


def test_columns_follow_the_models_field_order_quoted_and_optionally_prefixed():
    names = [field.column for field in Account._meta.concrete_fields]
    assert columns(Account) == ", ".join(f'"{name}"' for name in names)
    assert columns(Account, "a") == ", ".join(f'a."{name}"' for name in names)


def test_a_fetched_instance_equals_the_orms_json_and_arrays_included(requester):
    created = TextRequest.objects.create(
        account=requester.account,
        kind=TextRequest.Kind.CHAT,
        prompt="",
        messages=[{"role": "user", "content": "héllo"}],
        params={"temperature": 0.5},
        requested_models=["m1", "m2"],
        expires_at=timezone.now() + timedelta(minutes=5),
    )
    loaded = TextRequest.objects.get(pk=created.pk)
    sql = f"SELECT {columns(TextRequest)}, 41 + 1 FROM {TextRequest._meta.db_table} WHERE id = %s"

    fetched = fetch_instance(TextRequest, sql, [loaded.pk], extra=["answer"])

    assert fetched is not None and fetched.pk == loaded.pk
    assert model_to_dict(fetched) == model_to_dict(loaded)
    assert fetched.messages == [{"role": "user", "content": "héllo"}]  # JSON decoded, not text
    assert fetched.params == {"temperature": 0.5}
    assert fetched.requested_models == ["m1", "m2"]
    assert fetched.answer == 42
    assert fetched._state.adding is False and fetched._state.db == connection.alias


def _insert_select(request: TextRequest) -> None:
    names, values = insert_columns(TextRequest)
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {TextRequest._meta.db_table} ({names}) SELECT {values}", insert_values(request)
        )


def test_an_insert_select_of_an_instance_stores_what_the_orms_save_would(requester):
    now = timezone.now()
    fields = {
        "account": requester.account,
        "kind": TextRequest.Kind.CHAT,
        "prompt": "p",
        "messages": [{"role": "user", "content": "héllo"}],
        "params": {"temperature": 0.5},
        "requested_models": ["m1"],
        "created_at": now,
        "expires_at": now + timedelta(minutes=5),
        "deadline_at": None,  # a NULL as its column's type, not as text
    }
    written = TextRequest(**fields)
    _insert_select(written)
    saved = TextRequest.objects.create(**fields)
    stored = TextRequest.objects.get(pk=written.pk)
    assert model_to_dict(stored, exclude=["id"]) == model_to_dict(
        TextRequest.objects.get(pk=saved.pk), exclude=["id"]
    )


def test_an_insert_selects_casts_keep_the_columns_length_bound(requester):
    # A cast to varchar(8) would cut "chat-and-more" to fit; the INSERT must refuse it.
    _, values = insert_columns(TextRequest)
    assert "::varchar," in values and "(8)" not in values
    too_long = TextRequest(account=requester.account, kind="chat-and-more", expires_at=timezone.now())
    with pytest.raises(DataError):
        _insert_select(too_long)


def test_no_row_gives_none():
    sql = f"SELECT {columns(Account)} FROM {Account._meta.db_table} WHERE name = %s"
    assert fetch_instance(Account, sql, ["nobody"]) is None


def test_a_statement_with_more_columns_than_it_names_is_refused():
    sql = f"SELECT {columns(Account)}, 1, 2 FROM {Account._meta.db_table}"
    with pytest.raises(ValueError):
        fetch_instance(Account, sql, [], extra=["one"])


def test_several_models_from_one_row_with_fields_left_out_deferred(requester):
    sql = (
        f"SELECT {columns(Account, 'a', ('name',))}, {columns(Account, 'b')} "
        f"FROM {Account._meta.db_table} AS a, {Account._meta.db_table} AS b WHERE a.id = %s AND b.id = %s"
    )
    short, full = fetch_instances(
        sql, [requester.account.pk, requester.account.pk], (Account, ("name",)), (Account, None)
    )
    assert short.pk == full.pk == requester.account.pk and short.name == "requester"
    left_out = {field.attname for field in Account._meta.concrete_fields} - {"id", "name"}
    assert "api_key_hash" in left_out and "trusted" in left_out
    assert short.get_deferred_fields() == left_out
    assert full.get_deferred_fields() == set()


def test_a_part_an_outer_join_did_not_find_is_none_and_the_others_still_load(requester):
    sql = (
        f"SELECT {columns(Account, 'a')}, {columns(Account, 'b', ('name',))} "
        f"FROM {Account._meta.db_table} AS a LEFT JOIN {Account._meta.db_table} AS b ON b.id = %s "
        "WHERE a.id = %s"
    )
    found, missing = fetch_instances(sql, [-1, requester.account.pk], (Account, None), (Account, ("name",)))
    assert found.pk == requester.account.pk and missing is None
    both = fetch_instances(
        sql, [requester.account.pk, requester.account.pk], (Account, None), (Account, ("name",))
    )
    assert [account.pk for account in both] == [requester.account.pk] * 2


def test_parts_that_do_not_cover_the_row_or_name_no_field_are_refused(requester):
    sql = f"SELECT {columns(Account)}, 1 FROM {Account._meta.db_table} WHERE id = %s"
    with pytest.raises(ValueError):
        fetch_instances(sql, [requester.account.pk], (Account, None))
    with pytest.raises(ValueError):
        columns(Account, "", ("no_such_field",))
