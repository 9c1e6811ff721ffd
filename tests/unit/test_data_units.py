"""The pure parts of export and retention: the archive's layout and counts, the periods'
defaults, and the purge plan's tables, cutoffs and order."""

from __future__ import annotations

import io
import json
import zipfile
from datetime import UTC, datetime, timedelta

import pytest
from pydantic import ValidationError

from parley.archive import KINDS, ArchivedFile, ArchivedSession, ArchiveWriter, read_manifest
from parley.retention import EXPIRED_EXPORTS, PERIOD_TABLES, RetentionPeriods, purge_plan
from parley.store.lifecycle.retention import PURGEABLE
from parley.tenancy import TenantConfig

NOW = datetime(2026, 12, 2, 3, 30, tzinfo=UTC)


def _session(files: list[ArchivedFile]) -> ArchivedSession:
    return ArchivedSession(
        id="ses_1",
        created_at=NOW.isoformat(),
        deleted_at=None,
        messages=[{"id": "msg_1", "text": "hello"}, {"id": "msg_2", "text": "hi"}],
        pinned_facts=[{"key": "name", "value": "Eve"}],
        actions=[],
        feedback=[{"message_id": "msg_2", "rating": "up"}],
        files=files,
    )


def test_the_archive_holds_what_the_manifest_counts_and_files_stay_in_their_folder() -> None:
    writer = ArchiveWriter(export_id="exp_1", tenant_id="t", user_id="u", created_at="now")
    sneaky = ArchivedFile("file_1", "../../etc/passwd", "text/plain", b"\x00bytes", "now")
    writer.add_session(_session([sneaky]))
    writer.add_memory(consent=True, items=[{"key": "size", "value": "44"}])
    archive = writer.finish()
    manifest = read_manifest(archive)
    assert manifest["counts"] == {
        "sessions": 1,
        "messages": 2,
        "files": 1,
        "memory_items": 1,
        "pinned_facts": 1,
        "feedback": 1,
        "actions": 0,
    }
    assert set(manifest["counts"]) == set(KINDS)
    opened = zipfile.ZipFile(io.BytesIO(archive))
    session = json.loads(opened.read(manifest["sessions"][0]["path"]))
    [described] = session["files"]
    assert described["path"].startswith("sessions/ses_1/files/file_1-")
    assert ".." not in described["path"]
    assert opened.read(described["path"]) == b"\x00bytes"
    assert json.loads(opened.read("memory.json"))["consent"] is True


def test_an_unset_period_is_the_default_and_zero_keeps_forever() -> None:
    periods = RetentionPeriods(messages_days=0, summaries_days=5)
    defaults = {"messages": 30, "prompts": 3, "summaries": 0, "memory": 0}
    assert periods.days(defaults) == {"messages": 0, "prompts": 3, "summaries": 5, "memory": 0}
    plan = purge_plan(periods.days(defaults), NOW)
    tables = [table for table, _ in plan]
    assert tables == [*PERIOD_TABLES["prompts"], *PERIOD_TABLES["summaries"], EXPIRED_EXPORTS]
    cutoffs = dict(plan)
    assert cutoffs["model_calls"] == NOW - timedelta(days=3)
    assert cutoffs["pinned_facts"] == NOW - timedelta(days=5)
    assert cutoffs[EXPIRED_EXPORTS] == NOW


def test_copies_of_the_conversation_never_outlive_its_messages() -> None:
    # Prompts forever and summaries 90 days, messages 7: both go after 7; memory keeps its own.
    periods = RetentionPeriods(messages_days=7, prompts_days=0, summaries_days=90, memory_days=60)
    assert periods.days({}) == {"messages": 7, "prompts": 7, "summaries": 7, "memory": 60}
    assert RetentionPeriods(messages_days=7, prompts_days=2).days({})["prompts"] == 2


def test_rows_that_point_at_others_go_first() -> None:
    order = [t for tables in PERIOD_TABLES.values() for t in tables]
    assert order.index("feedback") < order.index("messages")
    assert order.index("tool_calls") < order.index("model_calls")


def test_with_every_period_forever_only_expired_exports_go() -> None:
    assert [t for t, _ in purge_plan(RetentionPeriods().days({}), NOW)] == [EXPIRED_EXPORTS]


def test_a_tenant_config_takes_periods_and_refuses_negative_ones() -> None:
    config = TenantConfig.model_validate({"retention": {"messages_days": 30}})
    assert config.retention is not None and config.retention.messages_days == 30
    with pytest.raises(ValidationError):
        TenantConfig.model_validate({"retention": {"messages_days": -1}})
    with pytest.raises(ValidationError):
        TenantConfig.model_validate({"retention": {"message_days": 30}})


def test_the_store_can_purge_every_table_a_period_names() -> None:
    named = {t for tables in PERIOD_TABLES.values() for t in tables} | {EXPIRED_EXPORTS}
    assert named == PURGEABLE
