"""Typed rows (store/rows.py): what a repository function hands its caller is a frozen copy of
the ORM object's fields, so a caller can neither mutate the stored row nor lazy-load through
it. Built here from the real models, without a database."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime

import pytest

from parley.store.lifecycle.exports import ExportRow
from parley.store.models import Export, Tenant
from parley.store.rows import typed_row
from parley.store.sessions import TurnRow
from parley.store.tenants import TenantRow

NOW = datetime(2026, 12, 2, 5, 0, tzinfo=UTC)


def test_a_typed_row_copies_the_fields_it_names_and_is_frozen() -> None:
    tenant = Tenant(id="acme", name="Acme", paused=True, config={"model": "m"}, created_at=NOW)
    row = typed_row(TenantRow, tenant, config={"model": "m"})
    assert row == TenantRow(id="acme", paused=True, config={"model": "m"})
    with pytest.raises(dataclasses.FrozenInstanceError):
        row.paused = False  # type: ignore[misc]
    tenant.paused = False  # the ORM object moving on does not move the copy
    assert row.paused is True


def test_an_override_stands_in_for_what_the_model_stores_otherwise() -> None:
    export = Export(
        id="exp_1",
        tenant_id="acme",
        user_id="priya",
        state="ready",
        sessions_total=2,
        sessions_done=2,
        counts=None,
        size=10,
        created_at=NOW,
        expires_at=NOW,
        finished_at=NOW,
    )
    row = typed_row(ExportRow, export, counts={})
    assert row.counts == {} and row.size == 10 and row.user_id == "priya"


def test_a_row_naming_a_field_the_object_lacks_fails_loudly() -> None:
    with pytest.raises(AttributeError):
        typed_row(TurnRow, Tenant(id="acme", name="Acme"))
