"""The demo model's answers about attached files: it reads what the prompt shows of them
(parley/attachments.py), says what it read, and quotes the sentence or CSV row that shares
most words with the question. It quotes, never composes, so it cannot invent a fact; and what
a file says is quoted as the file's, never obeyed."""

from __future__ import annotations

import csv
import io
import re
from typing import Any

from parley.attachments import FileView, read_files
from parley.file_text import CSV
from parley.memory import recall_terms
from parley.window import relevance

_SENTENCES = re.compile(r"(?<=[.!?])\s+|\n+")
_PART = re.compile(r"^\[part \d+ of \d+\]$")


def answer_from_files(messages: list[dict[str, Any]], question: str) -> str | None:
    """The answer when the prompt shows attached files; None when it shows none."""
    files = read_files(messages)
    if not files:
        return None
    read = "I read " + _and([_described(f) for f in files]) + "."
    terms = recall_terms(question)
    best: tuple[int, str, str] | None = None  # (score, file name, passage)
    for view in files:
        for passage in _passages(view):
            score = relevance(passage, terms)
            if score > 0 and (best is None or score > best[0]):
                best = (score, view.name, passage)
    if best is None:
        return f"{read} I found nothing in them about that; which part should I look at?"
    _, name, passage = best
    return f'{read} {name} says: "{passage}"'


def _described(view: FileView) -> str:
    if view.parts is not None:
        shown = _and([str(p) for p in view.parts]) if view.parts else "none"
        noun = "part" if len(view.parts) == 1 else "parts"
        return f"{view.name} (too long to read whole, so only {noun} {shown} of {view.of})"
    if view.pages is not None:
        return f"{view.name} ({view.pages} page{'s' if view.pages != 1 else ''})"
    if view.rows is not None:
        return f"{view.name} ({view.rows} row{'s' if view.rows != 1 else ''})"
    return f"{view.name} ({len(view.text):,} characters)"


def _passages(view: FileView) -> list[str]:
    """Sentences of a document; rows of a CSV, each as `column: value` pairs."""
    if view.content_type == CSV and view.parts is None:
        rows = [r for r in csv.reader(io.StringIO(view.text)) if any(c.strip() for c in r)]
        if len(rows) < 2:
            return []
        header = rows[0]
        return [
            ", ".join(f"{h}: {v}" for h, v in zip(header, row, strict=False)) for row in rows[1:]
        ]
    pieces = (" ".join(s.split()) for s in _SENTENCES.split(view.text))
    return [p for p in pieces if p and not _PART.match(p)]


def _and(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]
