"""The arithmetic the memory figures read off stored prompts (bench/prompt_figures.py): the
token table's row, what a prompt shows verbatim, and LoCoMo's footprint and evidence in the
prompt; then the tables drawn from them (issue 26, acceptance 3 and 4)."""

from __future__ import annotations

from typing import Any

import pytest

from bench.locomo_api import askable, render_locomo_api
from bench.memory import render_memory
from bench.prompt_figures import (
    RECALL_HEADER,
    Call,
    Question,
    context_tokens,
    footprint,
    shown_seqs,
    token_row,
)

BLOCKS = {"instructions": 500, "state": 20, "current": 30, "history": 200, "summary": 50}


def test_the_context_is_the_prompt_less_its_fixed_blocks() -> None:
    assert context_tokens(BLOCKS) == 250
    assert context_tokens({"instructions": 500, "current": 30}) == 0


def test_a_row_counts_the_provider_usage_and_the_summarizer_against_the_naive_resend() -> None:
    sizes = {1: 40, 2: 60, 3: 40, 4: 60}  # seq -> tokens of each stored message
    calls = [
        # Turn 1 (user seq 1): nothing earlier; usage reported by the provider.
        Call({"blocks": BLOCKS, "prompt_tokens": 800}, {"input_tokens": 810}, 1),
        # Turn 2 (user seq 3): no usage reported, so the packer's count; cached tokens kept.
        Call({"blocks": BLOCKS, "prompt_tokens": 900}, {"cached_tokens": 500}, 3),
    ]
    row = token_row(calls, sizes, turns=2, summaries=1, summarizer_in=300, summarizer_out=40)
    fixed = 550
    assert row["naive_input_tokens"] == fixed + (fixed + 40 + 60)
    assert row["turn_input_tokens"] == 810 + 900
    assert row["input_tokens"] == 810 + 900 + 300  # the summarizer's input counts
    assert row["ratio"] == pytest.approx(2010 / 1200)
    assert (row["largest_prompt"], row["cached_tokens"]) == (900, 500)
    assert (row["summarizer_tokens"], row["model_calls"]) == (340, 2)


def test_a_prompt_shows_its_window_and_the_recalled_lines_only() -> None:
    request: dict[str, Any] = {
        "budget": {"window_from_seq": 40},
        "messages": [
            {"role": "system", "content": "You are the assistant."},
            # A summary's line shaped like a recalled one is not a recalled line.
            {"role": "system", "content": "Summary of the conversation up to seq 30:\n7 user: x"},
            {
                "role": "system",
                "content": f"{RECALL_HEADER} (seq role: text):\nOn May 8:\n3 user: A: hi\n"
                "12 assistant: B: a dog",
            },
        ],
    }
    assert shown_seqs(request, 43) == {3, 12, 40, 41, 42}
    # No window recorded: nothing before the current message, but recall still counts.
    request["budget"]["window_from_seq"] = None
    assert shown_seqs(request, 43) == {3, 12}


def test_the_footprint_is_the_mean_context_over_the_conversation() -> None:
    questions = [
        Question(1, frozenset({3, 12}), frozenset({3, 12, 40}), context=600, prompt=1200),
        Question(2, frozenset({5}), frozenset({3}), context=400, prompt=1000),
        Question(4, frozenset({40}), frozenset({40}), context=500, prompt=1100),
    ]
    figures = footprint(questions, conversation_tokens=10_000)
    assert figures["footprint"] == pytest.approx(0.05)
    assert figures["evidence_in_prompt"] == pytest.approx(2 / 3)
    assert figures["missed_by_category"] == {2: 1}
    assert (figures["largest_context_tokens"], figures["mean_prompt_tokens"]) == (600, 1100)
    assert footprint([], 10_000)["questions"] == 0


def test_only_questions_whose_evidence_was_posted_are_asked() -> None:
    conv = {
        "qa": [
            {"question": "a", "evidence": ["D1:1"], "category": 1},
            {"question": "b", "evidence": ["D1:1", "D16:2"], "category": 4},  # not posted
            {"question": "c", "evidence": ["D1:2"], "category": 5},  # adversarial
            {"question": "d", "evidence": [], "category": 2},
        ]
    }
    assert [q["question"] for q in askable(conv, {"D1:1": 1, "D1:2": 2})] == ["a"]


def test_the_token_table_shows_the_failing_summarizer_row_and_its_check() -> None:
    demo = {
        "turns": 50,
        "model_calls": 80,
        "input_tokens": 100,
        "naive_input_tokens": 500,
        "ratio": 0.2,
        "largest_prompt": 9,
        "cached_tokens": 0,
        "summaries": 3,
        "summarizer_input_tokens": 10,
        "summarizer_output_tokens": 2,
        "summarizer_tokens": 12,
    }
    plain = demo | {
        "summarizer": "plain text (fails)",
        "ratio": 0.24,
        "input_tokens": 120,
        "written_by": ["fallback"],
        "provider_summary_requests": 6,
        "provider_summarizer_input_tokens": 30,
    }
    memory = {"tokens": [demo, plain], "done": [], "locomo_share": 0.11, "locomo": []}
    memory["done"] = {"error": "skipped"}
    shown = render_memory(memory)
    assert "\ndemo " in shown and "\nplain " in shown
    assert "input 120 tokens = 24.0% of naive 500" in shown
    assert "written by fallback; the server was asked 6 summary requests" in shown


def test_the_locomo_api_table_names_its_figures() -> None:
    questions = [Question(1, frozenset({3}), frozenset({3}), context=500, prompt=900)]
    figures = {
        "conversation": "conv-50",
        "sessions": 15,
        "turns_posted": 271,
        "session_tokens": 14_000,
        "summary_versions": 9,
        "written_by": ["fallback"],
        "summarizer_requests": 18,
        "summarizer_input_tokens": 9000,
        **footprint(questions, 10_000),
    }
    shown = render_locomo_api(figures)
    assert "evidence in prompt 100.0%" in shown and "footprint  5.0%" in shown


def test_a_failed_plain_row_is_named_under_the_table_the_other_rows_stand() -> None:
    memory = {
        "tokens": [],
        "tokens_plain": {"error": "RuntimeError: turn 3 ended error"},
        "done": {"error": "skipped"},
        "locomo_share": 0.11,
        "locomo": [],
    }
    assert "(c) plain-text summarizer row FAILED: RuntimeError: turn 3" in render_memory(memory)
