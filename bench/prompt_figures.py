"""What the memory figures read off stored prompts: pure arithmetic over `model_calls.request`
and the conversation's message sizes, shared by the token table (bench/memory.py, section
(c), whose table is drawn here) and LoCoMo through the API (bench/locomo_api.py, section (n)).

A stored request carries the prompt it sent (`messages`) and how the packer built it
(`budget`: tokens per kind of block, where the recent window began). From those:

- a turn's conversation context: the prompt less standing instructions and tool schemas, the
  state block and the current message (the same cut as section (e)'s footprint);
- the naive prompt for the same call: those fixed blocks plus every earlier message in full;
- the seqs a prompt shows verbatim: the recent window, and the recalled lines kept in the
  recall block (their `seq role:` prefixes).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

from parley.prompt import RECALLED_SEQ

# The blocks every prompt carries whatever the conversation: not part of its memory.
FIXED_BLOCKS = ("instructions", "state", "current")
RECALL_HEADER = "Earlier in this conversation, recalled by search"


@dataclass(frozen=True)
class Call:
    """One model call of a turn, as the token table reads it."""

    budget: dict[str, Any]  # the stored request's `budget`
    usage: dict[str, Any]  # as the provider reported it (may be empty)
    user_seq: int  # the seq of the user message its turn answers


def context_tokens(blocks: dict[str, int]) -> int:
    """The conversation's part of a prompt: every block but the fixed ones."""
    return sum(tokens for kind, tokens in blocks.items() if kind not in FIXED_BLOCKS)


def token_row(
    calls: list[Call],
    sizes: dict[int, int],
    *,
    turns: int,
    summaries: int,
    summarizer_in: int,
    summarizer_out: int,
) -> dict[str, Any]:
    """One row of the token table: the turns' prompts (the provider's count where it gave one)
    plus the summarizer's input, against resending everything (`sizes`: seq -> tokens of each
    stored message with its framing)."""
    used = naive = largest = cached = 0
    for call in calls:
        blocks = call.budget["blocks"]
        prompt = int(call.usage.get("input_tokens", call.budget["prompt_tokens"]))
        used += prompt
        largest = max(largest, prompt)
        cached += int(call.usage.get("cached_tokens", 0))
        fixed = sum(blocks.get(kind, 0) for kind in FIXED_BLOCKS)
        naive += fixed + sum(size for seq, size in sizes.items() if seq < call.user_seq)
    # The summarizer's requests are part of what the conversation cost: its input counts with
    # the turns' prompts against the naive resend, and both its sides are shown apart.
    return {
        "turns": turns,
        "model_calls": len(calls),
        "input_tokens": used + summarizer_in,
        "turn_input_tokens": used,
        "naive_input_tokens": naive,
        "ratio": (used + summarizer_in) / naive if naive else float("nan"),
        "largest_prompt": largest,
        "cached_tokens": cached,
        "summaries": summaries,
        "summarizer_input_tokens": summarizer_in,
        "summarizer_output_tokens": summarizer_out,
        "summarizer_tokens": summarizer_in + summarizer_out,
    }


def render_tokens(tokens: list[dict[str, Any]]) -> list[str]:
    """Table (c): a row per conversation, then the check of each row whose summarizer
    failed."""
    lines = [
        "(c) Input tokens over scripted conversations (naive = resend everything; input = the"
        " turns' prompts and the summarizer's input; demo: the demo model, whose summarizer is"
        " code; plain: OpenAI's wire format to a local server that answers summaries in prose)",
        f"{'summarizer':<11}{'turns':>6}{'calls':>7}{'input tok':>11}{'naive tok':>11}"
        f"{'ratio':>8}{'largest':>9}{'cached':>9}{'summaries':>11}{'summ. in':>10}"
        f"{'summ. out':>11}",
    ]
    for r in tokens:
        # Figures measured before the summarizer's sides were kept apart show its total.
        summ_in = r.get("summarizer_input_tokens", r["summarizer_tokens"])
        summ_out = r.get("summarizer_output_tokens", "-")
        lines.append(
            f"{r.get('summarizer', 'demo').split()[0]:<11}{r['turns']:>6}{r['model_calls']:>7}"
            f"{r['input_tokens']:>11}{r['naive_input_tokens']:>11}{r['ratio'] * 100:>7.1f}%"
            f"{r['largest_prompt']:>9}{r['cached_tokens']:>9}{r['summaries']:>11}"
            f"{summ_in:>10}{summ_out:>11}"
        )
    for r in tokens:
        if "provider_summary_requests" in r:
            lines.append(
                f"  plain, {r['turns']} turns: input {r['input_tokens']} tokens = "
                f"{r['ratio'] * 100:.1f}% of naive {r['naive_input_tokens']} (issue 26: at most"
                f" 25%); summary versions {r['summaries']} written by "
                f"{', '.join(r.get('written_by', [])) or '-'}; the server was asked "
                f"{r['provider_summary_requests']} summary requests of "
                f"{r['provider_summarizer_input_tokens']} input tokens (stored: "
                f"{r['summarizer_input_tokens']})"
            )
    return lines


def shown_seqs(request: dict[str, Any], user_seq: int) -> set[int]:
    """The earlier messages a stored prompt shows verbatim: the recent window (from its first
    seq up to the current message) and the recalled lines the packer kept."""
    start = request["budget"].get("window_from_seq") or user_seq
    shown = set(range(start, user_seq))
    for message in request["messages"]:
        content = str(message.get("content") or "")
        if message.get("role") == "system" and content.startswith(RECALL_HEADER):
            shown |= {int(seq) for seq in RECALLED_SEQ.findall(content)}
    return shown


@dataclass(frozen=True)
class Question:
    """One question asked through the API, as its first model call's prompt showed it."""

    category: int
    evidence: frozenset[int]  # the seqs holding the answer
    shown: frozenset[int]  # `shown_seqs` of the prompt
    context: int  # `context_tokens` of the prompt
    prompt: int  # the whole prompt, as stored


def footprint(questions: list[Question], conversation_tokens: int) -> dict[str, Any]:
    """Evidence in the prompt and the footprint (mean conversation context of a question's
    prompt over the whole conversation's tokens), with misses by LoCoMo category."""
    if not questions:
        return {"questions": 0, "evidence_in_prompt": float("nan"), "footprint": float("nan")}
    found = [q for q in questions if q.evidence <= q.shown]
    missed: dict[int, int] = {}
    for q in questions:
        if not q.evidence <= q.shown:
            missed[q.category] = missed.get(q.category, 0) + 1
    mean_context = statistics.fmean(q.context for q in questions)
    return {
        "questions": len(questions),
        "evidence_in_prompt": len(found) / len(questions),
        "missed_by_category": dict(sorted(missed.items())),
        "mean_context_tokens": mean_context,
        "largest_context_tokens": max(q.context for q in questions),
        "mean_prompt_tokens": statistics.fmean(q.prompt for q in questions),
        "conversation_tokens": conversation_tokens,
        "footprint": mean_context / conversation_tokens if conversation_tokens else float("nan"),
    }
