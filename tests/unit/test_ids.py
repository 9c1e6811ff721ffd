"""Derived ids are stored in rows and committed workflow histories: their strings must not
drift. Each is pinned here to the exact form the code produced before it moved."""

from __future__ import annotations

import hashlib

from parley import ids


def test_derived_ids_keep_their_exact_strings() -> None:
    assert ids.workflow_id_for_turn("trn_1") == "turn-trn_1"
    assert ids.message_id_for_call("mc_abc") == "msg_abc"
    assert ids.override_message_id(model_call_id="mc_abc") == "msg_abco"
    assert ids.tool_call_row_id(model_call_id="mc_a", position=0) == "mc_a:0"
    digest = hashlib.sha256(b"mc_a:call_1").hexdigest()[:20]
    assert ids.tool_result_message_id(tool_call_id="mc_a:call_1") == f"msg_t{digest}"
    assert ids.unfinished_message_id(turn_id="trn_9", streamed_message_id=None) == "msg_9x"
    assert ids.unfinished_message_id(turn_id="trn_9", streamed_message_id="msg_s") == "msg_s"
    assert ids.unfinished_message_fallback_id(candidate="msg_9x") == "msg_9xx"
    action_digest = hashlib.sha256(b"mc_a:0").hexdigest()[:24]
    assert ids.action_id_for_call(tool_call_id="mc_a:0") == f"act_{action_digest}"
    assert ids.handoff_id_for_call(tool_call_id="mc_a:0") == f"hof_{action_digest}"
    assert ids.email_idempotency_key(action_id="act_1") == "parley-act_1"
    prefix_digest = hashlib.sha256(b"instructions").hexdigest()[:16]
    assert ids.prompt_cache_key(stable_prefix="instructions") == f"parley-p2-{prefix_digest}"


def test_the_prompt_cache_key_names_the_prefix_not_the_tenant() -> None:
    """Equal prefixes share a key; another prefix gets another; no tenant id is in it."""
    key = ids.prompt_cache_key(stable_prefix="You are the Northwind assistant.")
    assert key == ids.prompt_cache_key(stable_prefix="You are the Northwind assistant.")
    assert key != ids.prompt_cache_key(stable_prefix="You are the Acme assistant.")
    assert "northwind" not in key.lower()


def test_a_random_id_carries_its_prefix() -> None:
    assert ids.new_id("trn").startswith("trn_")
    assert ids.new_id("trn") != ids.new_id("trn")


def test_an_anthropic_length_call_id_yields_a_distinct_action_per_turn() -> None:
    # Anthropic's tool-use ids are exactly 30 characters; two turns may even see the same one
    # (a replayed or fake provider). The action comes from the turn's own call, not from it.
    provider_id = "toolu_01" + "A" * 22
    assert len(provider_id) == 30
    actions = {
        ids.action_id_for_call(
            tool_call_id=ids.tool_call_row_id(model_call_id=model_call, position=0)
        )
        for model_call in (ids.new_id("mc"), ids.new_id("mc"), ids.new_id("mc"))
    }
    assert len(actions) == 3
    assert all(len(a) <= 40 for a in actions)
