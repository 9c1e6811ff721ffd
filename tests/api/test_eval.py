"""`parley eval --compare` (issue 29, acceptance 2) against the session's shared stack on the
demo model: a configuration withholding `get_order` fails the conversations that need it,
naming the expectation, and exits non-zero; an identical configuration shows no differences;
the tenant's own configuration is back afterwards. The whole starter suite and its report
are tests/web/test_eval_report.py."""

from __future__ import annotations

import json
import shutil
from decimal import Decimal
from pathlib import Path

import httpx

from parley.eval.capture import capture_feedback
from parley.eval.command import EXIT_REGRESSION, Options, evaluate
from parley.eval.suite import load_conversation
from parley.store.db import Database
from parley.tenancy import TenantConfig
from tests.support.client import ParleyClient
from tests.support.evals import STARTER, eval_target
from tests.support.toolkit import eventually


def subset(tmp_path: Path, *names: str) -> Path:
    folder = tmp_path / "suite"
    folder.mkdir()
    for name in names:
        shutil.copy(STARTER / name, folder / name)
    return folder


async def test_withholding_get_order_fails_the_conversations_that_need_it(
    api_url: str,
    northwind_url: str,
    sessions: Database,
    tokens: dict[str, str],
    tmp_path: Path,
) -> None:
    target = eval_target(api_url, sessions, northwind_url)
    suite = subset(
        tmp_path,
        "03-order-status.yaml",
        "08-stated-id-needs-no-question.yaml",
        "09-referent-change-by-id.yaml",
    )
    async with httpx.AsyncClient(
        base_url=api_url, headers={"Authorization": f"Bearer {tokens['admin']}"}
    ) as admin:
        config_url = "/v1/admin/tenants/northwind/config"
        before = (await admin.get(config_url)).json()["config"]
        a = tmp_path / "a.json"
        a.write_text(json.dumps(before))
        b = tmp_path / "b.json"
        allowed = sorted(TenantConfig.known_tools() - {"get_order"})
        b.write_text(json.dumps({**before, "tool_allowlist": allowed}))

        options = Options(suite=suite, compare=(a, b), quiet=True)
        outcome = await evaluate(options, target)
        assert outcome.exit_code == EXIT_REGRESSION
        assert outcome.differences is not None
        changed = {d["name"]: d for d in outcome.differences}
        assert set(changed) == {
            "a stated order id needs no clarification",
            "referent changes when the user names another order",
        }
        for difference in changed.values():
            assert (difference["a"], difference["b"]) == ("pass", "fail")
            assert any(
                "tools.called get_order(order_id=8390): not called" in problem
                for problem in difference["only_in_b"]
            ), difference
        assert sorted(line.split(":")[0] for line in outcome.regressions) == sorted(changed)
        assert (await admin.get(config_url)).json()["config"] == before  # restored
        # What each conversation cost under A and under B, from the ledger, and the change.
        assert outcome.costs is not None
        assert [c["name"] for c in outcome.costs][-1] == "suite"
        assert len(outcome.costs) == 4
        for cost in outcome.costs:
            assert Decimal(cost["a"]) > 0 and Decimal(cost["b"]) > 0, cost
            assert Decimal(cost["difference"]) == Decimal(cost["b"]) - Decimal(cost["a"])
        suite_a = sum(Decimal(c["a"]) for c in outcome.costs[:-1])
        assert Decimal(outcome.costs[-1]["a"]) == suite_a

        same = await evaluate(Options(suite=suite, compare=(a, a), quiet=True), target)
        assert same.differences == [] and same.exit_code == 0
        assert (await admin.get(config_url)).json()["config"] == before


async def test_negative_feedback_becomes_a_redacted_draft_that_runs_skip(
    priya: ParleyClient,
    api_url: str,
    sessions: Database,
    tokens: dict[str, str],
    tmp_path: Path,
) -> None:
    sid = await priya.new_session()
    said = "Where is my order? Write to priya.other@example.net if needed."
    _, events = await priya.turn(sid, said)
    answer = events[-1].data["message"]
    url = f"/v1/sessions/{sid}/messages/{answer['id']}/feedback"
    comment = {"rating": "down", "comment": "Wrong order! Card 4111 1111 1111 1111 on file"}
    assert (await priya.http.post(url, json=comment)).status_code == 201
    target = eval_target(api_url, sessions, None)
    draft = tmp_path / "captured" / f"feedback-{answer['id']}.yaml"

    async def captured() -> list[Path] | None:
        await capture_feedback(
            url=api_url,
            admin_token=tokens["admin"],
            tenant="northwind",
            token_for=target.token_for,
            out=tmp_path / "captured",
        )
        return [draft] if draft.exists() else None

    await eventually(captured, timeout=10, what="a draft from the rating")
    text = draft.read_text()
    assert "example.net" not in text and "4111" not in text
    assert "[email]" in text and "[card]" in text and "DRAFT" in text
    conversation = load_conversation(draft)
    assert conversation.status == "draft" and conversation.user == "cust_2291"
    assert [step.say for step in conversation.steps] == [
        "Where is my order? Write to [email] if needed."
    ]
    assert conversation.source == {
        "feedback_message_id": answer["id"],
        "session_id": sid,
        "turn_id": answer["turn_id"],
    }
    # A draft is not run until a person labels it.
    outcome = await evaluate(Options(suite=draft.parent, quiet=True), target)
    assert outcome.runs[0]["conversations"] == []


async def test_the_runs_route_gives_an_operator_each_turns_tokens_and_trace(
    priya: ParleyClient, marco: ParleyClient, api_url: str, tokens: dict[str, str]
) -> None:
    sid = await priya.new_session()
    turn_id, _ = await priya.turn(sid, "Where is my order?")
    url = f"/v1/admin/tenants/northwind/sessions/{sid}/runs"
    async with httpx.AsyncClient(
        base_url=api_url, headers={"Authorization": f"Bearer {tokens['admin']}"}
    ) as admin:
        response = await admin.get(url)
        assert response.status_code == 200, response.text
        [turn] = response.json()["turns"]
        assert turn["turn_id"] == turn_id
        assert turn["tokens"]["input_tokens"] > 0 and turn["tokens"]["output_tokens"] > 0
        names = {span["name"] for span in turn["trace"]}
        assert any("model" in name for name in names), names
        unknown = await admin.get("/v1/admin/tenants/northwind/sessions/ses_nope/runs")
        assert unknown.status_code == 404
        other_tenant = await admin.get(f"/v1/admin/tenants/southwind/sessions/{sid}/runs")
        assert other_tenant.status_code == 404
    assert (await marco.http.get(url)).status_code == 403


async def test_a_conversation_with_an_edit_a_regenerate_and_a_switch_passes(
    api_url: str, northwind_url: str, sessions: Database, tmp_path: Path
) -> None:
    """The version steps (issue 42): each runs through the API, and what follows sees the
    version shown (the referent of the edit, then of the first version again)."""
    target = eval_target(api_url, sessions, northwind_url)
    suite = subset(tmp_path, "28-edit-regenerate-switch.yaml")
    outcome = await evaluate(Options(suite=suite, quiet=True), target)
    conversation = outcome.runs[0]["conversations"][0]
    assert conversation["passed"], conversation["failures"]
    kinds = [turn["kind"] for turn in conversation["turns"]]
    assert kinds == ["say", "say", "edit", "regenerate", "switch", "say"]
    assert outcome.exit_code == 0


async def test_a_conversation_handed_to_a_person_is_scored_by_its_open_case(
    api_url: str, northwind_url: str, sessions: Database, tmp_path: Path
) -> None:
    """`expect: {handoff: true}` (issue 43): asking for a person opens a case, and the
    step before it had none. The same expectation fails on a conversation that stays with
    the assistant."""
    target = eval_target(api_url, sessions, northwind_url)
    outcome = await evaluate(Options(suite=subset(tmp_path, "29-handoff.yaml"), quiet=True), target)
    conversation = outcome.runs[0]["conversations"][0]
    assert conversation["passed"], conversation["failures"]
    assert outcome.exit_code == 0

    wrong = tmp_path / "wrong"
    wrong.mkdir()
    (wrong / "stays.yaml").write_text(
        "name: stays with the assistant\nuser: cust_2291\nsteps:\n"
        "  - say: Where is my order?\n    expect: {handoff: true}\n"
    )
    failed = await evaluate(Options(suite=wrong, quiet=True), target)
    failures = failed.runs[0]["conversations"][0]["failures"]
    assert any("handoff True" in str(failure) for failure in failures), failures
    assert failed.exit_code != 0
