"""Every activity takes exactly one argument. Temporal decodes an activity's input with its
signature's types only when the number of arguments sent matches the number of parameters:
an activity with an optional second parameter, called with one argument (as a workflow of an
earlier shape calls it), gets a plain dict, and fails on its first attribute. For the output
screen that meant an answer let through unscreened (the workflow fails it open)."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PRODUCT = ("activities", "dispatch")


def _activities() -> list[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    found = []
    for package in PRODUCT:
        for path in sorted((REPO / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and any(
                    "activity.defn" in ast.unparse(d) for d in node.decorator_list
                ):
                    found.append((f"{path.relative_to(REPO)}:{node.name}", node))
    return found


def _parameters(node: ast.FunctionDef | ast.AsyncFunctionDef) -> list[str]:
    """Its parameters but `self`, a defaulted one marked `=`."""
    args = node.args
    positional = [a.arg for a in args.posonlyargs + args.args if a.arg != "self"]
    first_defaulted = len(positional) - len(args.defaults)
    named = [f"{n}=" if i >= first_defaulted else n for i, n in enumerate(positional)]
    rest = [f"{a.arg}=" for a in args.kwonlyargs]
    rest += [f"*{v.arg}" for v in (args.vararg,) if v is not None]
    rest += [f"**{v.arg}" for v in (args.kwarg,) if v is not None]
    return named + rest


def test_the_product_has_activities_to_check() -> None:
    names = {name.rsplit(":", 1)[1] for name, _ in _activities()}
    assert {"build_context", "call_model", "screen_input", "finish_turn"} <= names


def test_every_activity_takes_exactly_one_argument() -> None:
    params = {name: _parameters(node) for name, node in _activities()}
    wrong = {name: each for name, each in params.items() if len(each) != 1 or "=" in each[0]}
    assert wrong == {}, "an activity takes one dataclass; move the rest into it or out"
