"""Erasure's pure parts: the receipt's keyed hash, and the catalogue's order (a table is
emptied before every table it points at, so no batch trips a foreign key)."""

from __future__ import annotations

import pytest

from parley.config import DEV_ERASURE_RECEIPT_KEY, Settings
from parley.erasure import ErasureScope, subject_hash
from parley.store.lifecycle.erasure_catalogue import CATALOGUE
from parley.store.models import Base


def test_the_keyed_hash_names_nobody_and_needs_the_key() -> None:
    digest = subject_hash("k1", "northwind", "cust_2291")
    assert digest == subject_hash("k1", "northwind", "cust_2291")
    assert "cust_2291" not in digest and len(digest) == 64
    assert digest != subject_hash("k2", "northwind", "cust_2291")
    # The parts are kept apart: ("ab", "c") is not ("a", "bc").
    assert subject_hash("k", "ab", "c") != subject_hash("k", "a", "bc")


def test_every_table_goes_before_the_tables_it_points_at() -> None:
    order = [entry.table for entry in CATALOGUE]
    for table in Base.metadata.sorted_tables:
        if table.name not in order:
            continue
        for key in table.foreign_keys:
            target = key.column.table.name
            if target in order and target != table.name:
                assert order.index(table.name) < order.index(target), (table.name, target)


def test_a_session_erasure_never_touches_the_account() -> None:
    session_tables = {e.table for e in CATALOGUE if e.where(ErasureScope.session)}
    assert {"users", "api_tokens", "memory_consents"}.isdisjoint(session_tables)
    assert {"messages", "turns", "sessions", "user_memory"} <= session_tables


def test_outside_dev_the_published_receipt_key_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """With the key that ships in the code, anyone holding a user's ids could find whose
    receipt is whose: a production process does not start with it."""
    monkeypatch.delenv("PARLEY_ERASURE_RECEIPT_KEY", raising=False)
    production = {"env": "production", "database_url": "postgresql://db/parley"}
    with pytest.raises(ValueError, match="PARLEY_ERASURE_RECEIPT_KEY"):
        Settings(**production)
    assert Settings(**production, erasure_receipt_key="a-secret").erasure_receipt_key == "a-secret"
    assert Settings(env="dev").erasure_receipt_key == DEV_ERASURE_RECEIPT_KEY
