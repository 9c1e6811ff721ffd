"""The self-contained HTML report: one file, no script, no outside resource. Per conversation
its verdict and failing expectations, each turn linked to its workflow in the Temporal UI and
to its trace; the latency distributions and the token cost as inline SVG. Pure."""

from __future__ import annotations

from html import escape
from typing import Any

from parley.eval.report import TURN_TYPES

_STYLE = """
body{font:15px/1.45 system-ui,sans-serif;margin:2rem auto;max-width:70rem;padding:0 1rem;
color:#1b1b1b;background:#fff}
h1,h2,h3{line-height:1.2}table{border-collapse:collapse;margin:.5rem 0 1rem;width:100%}
th,td{border:1px solid #c8c8c8;padding:.3rem .5rem;text-align:left;vertical-align:top}
th{background:#f0f0f0}.pass{color:#116329;font-weight:600}.fail{color:#a40e26;font-weight:600}
ul.problems{margin:.3rem 0;color:#1b1b1b}a{color:#0b4fa8}
figure{margin:1rem 0}figcaption{font-weight:600}svg text{font:12px system-ui,sans-serif}
"""


def render(run: dict[str, Any], *, trace_url: str | None = None, diffs: Any = None) -> str:
    """`trace_url` is a template with `{turn_id}` and `{session_id}` for the trace viewer."""
    suite = run["suite"]
    parts = [
        '<!doctype html><html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>parley eval: {escape(run['label'])}</title><style>{_STYLE}</style></head>",
        f"<body><main><h1>parley eval: {escape(run['label'])}</h1>",
        _summary(suite),
        "<h2>Latency by turn type</h2>",
        _latency_plot(run),
        "<h2>Tokens per conversation</h2>",
        _token_plot(run),
    ]
    if diffs is not None:
        parts.append(_differences(diffs))
    parts.append("<h2>Conversations</h2>")
    parts += [_conversation(c, trace_url) for c in run["conversations"]]
    parts.append("</main></body></html>")
    return "\n".join(parts)


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value * 100:.0f}%"


def _summary(suite: dict[str, Any]) -> str:
    tools = suite["tool_correctness"]
    rows = [
        ("Conversations passed", f"{suite['passed']} of {suite['conversations']}"),
        ("Task completion", _pct(suite["task_completion"])),
        ("Write invariant violations", str(suite["invariant_violations"])),
        ("Context consistency", _pct(suite["context_consistency"])),
        ("Clarification recall", _pct(suite["clarification_recall"])),
        ("Over-asking rate", _pct(suite["over_asking_rate"])),
        ("Options usable", _pct(suite["options_usable"])),
        ("Tools: right tool", _pct(tools["right_tool"])),
        ("Tools: valid arguments", _pct(tools["valid_arguments"])),
        ("Tools: permitted", _pct(tools["permitted"])),
        ("Tools: result used", _pct(tools["result_used"])),
        ("Tokens in / out", f"{suite['tokens_in']} / {suite['tokens_out']}"),
    ]
    body = "".join(f"<tr><th scope='row'>{k}</th><td>{escape(v)}</td></tr>" for k, v in rows)
    return f"<h2>Suite</h2><table><caption>Suite metrics</caption>{body}</table>"


def _latency_plot(run: dict[str, Any]) -> str:
    """Each turn's time to first delta and to the end, as dots on one axis per turn type."""
    turns = [t for c in run["conversations"] for t in c["turns"]]
    values = [t["done_s"] for t in turns if t["done_s"] is not None] or [1.0]
    top = max(values) * 1.05 or 1.0
    width, left, row = 640, 150, 26
    rows = [(kind, metric) for kind in TURN_TYPES for metric in ("first_delta_s", "done_s")]
    height = row * len(rows) + 40
    marks = []
    for index, (kind, metric) in enumerate(rows):
        y = 20 + index * row
        label = (
            f"{kind.replace('_', ' ')}: {'first delta' if metric == 'first_delta_s' else 'done'}"
        )
        marks.append(f'<text x="4" y="{y + 4}" fill="#1b1b1b">{label}</text>')
        marks.append(f'<line x1="{left}" x2="{width - 10}" y1="{y}" y2="{y}" stroke="#c8c8c8"/>')
        for turn in turns:
            value = turn[metric]
            if turn["type"] == kind and value is not None:
                x = left + (width - left - 10) * value / top
                marks.append(
                    f'<circle cx="{x:.1f}" cy="{y}" r="3.5" fill="#0b4fa8" fill-opacity=".55"/>'
                )
    axis_y = height - 12
    marks.append(f'<text x="{left}" y="{axis_y}" fill="#1b1b1b">0 s</text>')
    marks.append(f'<text x="{width - 70}" y="{axis_y}" fill="#1b1b1b">{top:.2f} s</text>')
    table = _latency_table(run["suite"]["latency"])
    return _figure("Latency per turn, by turn type", width, height, marks) + table


def _latency_table(latency: dict[str, Any]) -> str:
    head = "<tr><th scope='col'>turn type</th><th scope='col'>turns</th>" + "".join(
        f"<th scope='col'>{h}</th>"
        for h in ("first delta p50", "first delta p95", "done p50", "done p95")
    )
    rows = "".join(
        f"<tr><td>{kind}</td><td>{f['turns']}</td>"
        + "".join(
            f"<td>{_ms(f[key])}</td>"
            for key in ("first_delta_p50_s", "first_delta_p95_s", "done_p50_s", "done_p95_s")
        )
        + "</tr>"
        for kind, f in latency.items()
    )
    return f"<table><caption>Latency percentiles</caption>{head}</tr>{rows}</table>"


def _ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value * 1000:.0f} ms"


def _token_plot(run: dict[str, Any]) -> str:
    rows = [(c["name"], c["tokens_in"] or 0, c["tokens_out"] or 0) for c in run["conversations"]]
    top = max([i + o for _, i, o in rows] or [1]) or 1
    width, left, row = 640, 230, 18
    height = row * len(rows) + 20
    marks = []
    for index, (name, tokens_in, tokens_out) in enumerate(rows):
        y = 6 + index * row
        scale = (width - left - 70) / top
        marks.append(f'<text x="4" y="{y + 11}" fill="#1b1b1b">{escape(name[:30])}</text>')
        marks.append(
            f'<rect x="{left}" y="{y}" width="{tokens_in * scale:.1f}" height="12" fill="#0b4fa8"/>'
        )
        marks.append(
            f'<rect x="{left + tokens_in * scale:.1f}" y="{y}" width="{tokens_out * scale:.1f}" '
            'height="12" fill="#b35900"/>'
        )
        total = left + (tokens_in + tokens_out) * scale + 4
        marks.append(
            f'<text x="{total:.1f}" y="{y + 11}" fill="#1b1b1b">{tokens_in}/{tokens_out}</text>'
        )
    caption = "Tokens in (blue) and out (orange) per conversation"
    return _figure(caption, width, height, marks)


def _figure(caption: str, width: int, height: int, marks: list[str]) -> str:
    return (
        f"<figure><figcaption>{escape(caption)}</figcaption>"
        f'<svg role="img" aria-label="{escape(caption)}" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" xmlns="http://www.w3.org/2000/svg">'
        f"<title>{escape(caption)}</title>{''.join(marks)}</svg></figure>"
    )


def _differences(diffs: list[dict[str, Any]]) -> str:
    if not diffs:
        return "<h2>Differences between A and B</h2><p>No differences.</p>"
    items = "".join(
        f"<li><strong>{escape(d['name'])}</strong>: A {d['a']}, B {d['b']}"
        + _problems("only in A", d.get("only_in_a", []))
        + _problems("only in B", d.get("only_in_b", []))
        + "</li>"
        for d in diffs
    )
    return f"<h2>Differences between A and B</h2><ul>{items}</ul>"


def _problems(title: str, problems: list[str]) -> str:
    if not problems:
        return ""
    return (
        f"<br>{title}:<ul class='problems'>"
        + "".join(f"<li>{escape(p)}</li>" for p in problems)
        + "</ul>"
    )


def _conversation(c: dict[str, Any], trace_url: str | None) -> str:
    verdict = '<span class="pass">pass</span>' if c["passed"] else '<span class="fail">fail</span>'
    problems = [*(f"invariant: {v}" for v in c["invariant_violations"]), *c["failures"]]
    listed = (
        "<ul class='problems'>" + "".join(f"<li>{escape(p)}</li>" for p in problems) + "</ul>"
        if problems
        else ""
    )
    head = (
        "<tr><th scope='col'>step</th><th scope='col'>said</th><th scope='col'>type</th>"
        "<th scope='col'>tools</th><th scope='col'>first delta</th><th scope='col'>done</th>"
        "<th scope='col'>links</th></tr>"
    )
    rows = "".join(_turn_row(t, trace_url) for t in c["turns"])
    traces = "".join(_trace(t) for t in c["turns"] if t["trace"])
    return (
        f"<section><h3>{escape(c['name'])}: {verdict}</h3>"
        f"<p>{escape(c['path'])} · tokens {c['tokens_in']}/{c['tokens_out']}</p>{listed}"
        f"<table><caption>Turns of {escape(c['name'])}</caption>{head}{rows}</table>"
        f"{traces}</section>"
    )


def _anchor(turn: dict[str, Any]) -> str:
    return f"trace-{turn['turn_id']}-{turn['step']}"


def _trace(turn: dict[str, Any]) -> str:
    """The turn's spans from the trace ledger, as the operator's runs route gave them."""
    items = "".join(
        f"<li>{escape(str(span['name']))} (attempt {span['attempt']}): "
        f"{escape(str(span['outcome']))}"
        f", {escape(str(span['started_at']))} to {escape(str(span['ended_at']))}</li>"
        for span in turn["trace"]
    )
    return (
        f'<details id="{_anchor(turn)}"><summary>Trace of step {turn["step"]} '
        f"({escape(str(turn['turn_id']))})</summary><ul>{items}</ul></details>"
    )


def _turn_row(turn: dict[str, Any], trace_url: str | None) -> str:
    links = []
    if turn["workflow_url"]:
        links.append(
            f'<a href="{escape(turn["workflow_url"])}">workflow of step {turn["step"]}</a>'
        )
    if trace_url and turn["turn_id"]:
        href = trace_url.format(turn_id=turn["turn_id"], session_id=turn["session_id"])
        links.append(f'<a href="{escape(href)}">trace of step {turn["step"]}</a>')
    elif turn["trace"]:
        links.append(f'<a href="#{_anchor(turn)}">trace of step {turn["step"]}</a>')
    if not links and turn["turn_id"]:
        links.append(escape(turn["turn_id"]))
    said = turn["text"] or turn["kind"]
    return (
        f"<tr><td>{turn['step']}</td><td>{escape(said)}</td><td>{turn['type']}</td>"
        f"<td>{escape(', '.join(turn['tools']))}</td><td>{_ms(turn['first_delta_s'])}</td>"
        f"<td>{_ms(turn['done_s'])}</td><td>{' · '.join(links)}</td></tr>"
    )
