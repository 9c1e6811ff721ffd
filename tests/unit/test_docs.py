"""The README and docs/ against the code: nothing the code defines goes undocumented.

Fast and stack-free: the tests read Settings' fields, the app's OpenAPI document (built, never
served), the contract's enums and the product source (with `ast`), and the Markdown files.
The generated tables are rewritten with `python -m parley.launch.docs` (docs/development.md).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Iterator
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from parley import errors
from parley.config import Settings
from parley.contracts import EventType, MessageStatus, TurnState, WarningCode
from parley.launch import docs as generated
from parley.live import READY, SESSION_EVENT_DATA, SessionEventType
from parley.statuses import ActionStatus, TurnErrorCode
from parley.wire import EVENT_DATA

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
DOCS = REPO / "docs"
MAX_README_LINES = 200
# Where the code hands an error code to a client: the API and the store's admission checks.
ERROR_CODE_SOURCES = ("api", "store")
PRODUCT = ("api", "workflows", "activities", "parley", "store", "gateway", "demo_backend")
PRODUCT += ("dispatch", "launch", "bench", "tests")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
VARIABLE = re.compile(r"PARLEY_[A-Z0-9_]*[A-Z0-9]")


def markdown_files() -> list[Path]:
    return [README, *sorted(DOCS.rglob("*.md"))]


@cache
def api_doc() -> str:
    return (DOCS / "api.md").read_text()


@cache
def openapi() -> dict[str, Any]:
    return generated.openapi_document()


def section(text: str, heading: str) -> str:
    """The text under `heading` (a whole line, `## ...`) up to the next heading as high."""
    level = len(heading) - len(heading.lstrip("#"))
    lines = text.splitlines()
    start = lines.index(heading) + 1
    end = next(
        (i for i in range(start, len(lines)) if re.match(rf"#{{1,{level}}} ", lines[i])),
        len(lines),
    )
    return "\n".join(lines[start:end])


def first_column_names(table: str) -> set[str]:
    """Every backticked name in the first cell of each row of a Markdown table."""
    names: set[str] = set()
    for line in table.splitlines():
        if line.startswith("| `"):
            names.update(re.findall(r"`([^`]+)`", line.split("|")[1]))
    return names


def slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    lines = path.read_text().splitlines()
    return {slug(line.lstrip("#")) for line in lines if re.match(r"#{1,6} ", line)}


# --- the README ----------------------------------------------------------------------------


def test_the_readme_is_read_in_five_minutes() -> None:
    lines = README.read_text().splitlines()
    assert len(lines) <= MAX_README_LINES, f"README.md has {len(lines)} lines"


def test_the_readme_gives_the_two_commands_and_ci_runs_its_test_command() -> None:
    readme = README.read_text()
    block = re.search(r"```sh\n(.*?)```", readme, re.S)
    assert block, "the README opens its quick start with a shell block"
    commands = [line.split("#")[0].strip() for line in block.group(1).splitlines()]
    assert commands == ["make run", "make test"]
    ci = [line for line in (REPO / ".ci" / "run").read_text().splitlines() if line.strip()]
    assert ci[-1].strip() == "make test", "CI runs exactly the README's test command"


def test_every_relative_link_points_to_a_file_and_heading_that_exist() -> None:
    broken = []
    for page in markdown_files():
        for target in LINK.findall(page.read_text()):
            if re.match(r"[a-z]+:", target):
                continue  # http(s), mailto
            file_part, _, anchor = target.partition("#")
            linked = (page.parent / file_part).resolve() if file_part else page
            if not linked.exists():
                broken.append(f"{page.relative_to(REPO)}: {target} (no such file)")
            elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
                broken.append(f"{page.relative_to(REPO)}: {target} (no such heading)")
    assert not broken, "\n".join(broken)


# --- configuration -------------------------------------------------------------------------


def test_the_generated_tables_match_the_code() -> None:
    stale = generated.stale_documents(DOCS, write=False)
    assert not stale, f"run `.venv/bin/python -m parley.launch.docs`: {stale} are stale"


def test_every_setting_is_documented_with_a_meaning() -> None:
    text = (DOCS / "configuration.md").read_text()
    _, block, _ = generated.split(text, "settings")
    documented = generated.meanings_in(block)
    for name, field in Settings.model_fields.items():
        variable = generated.env_names(name, field)[0]
        assert variable in documented, f"{variable} ({name}) is not in docs/configuration.md"
        meaning = documented[variable]
        assert meaning and meaning != generated.UNDOCUMENTED, f"{variable} has no meaning"
    every = {generated.env_names(n, f)[0] for n, f in Settings.model_fields.items()}
    assert set(documented) <= every, f"no longer settings: {set(documented) - every}"


def source_text() -> Iterator[str]:
    for root in PRODUCT:
        for path in (REPO / root).rglob("*.py"):
            yield path.read_text()
    yield (REPO / "worker.py").read_text()


def test_every_parley_variable_the_docs_name_exists() -> None:
    settings = {env for n, f in Settings.model_fields.items() for env in generated.env_names(n, f)}
    source = "\n".join(source_text())
    missing = {
        f"{page.relative_to(REPO)}: {name}"
        for page in markdown_files()
        for name in VARIABLE.findall(page.read_text())
        if name not in settings and name not in source
    }
    assert not missing, "named in the docs, unknown to the code:\n" + "\n".join(sorted(missing))


# --- the API contract ----------------------------------------------------------------------


def test_every_route_is_in_the_api_page() -> None:
    doc = api_doc()
    for path, operations in openapi()["paths"].items():
        for method in operations:
            assert f"| {method.upper()} | `{path}` |" in doc, f"{method.upper()} {path}"


def assert_table_matches(heading: str, names: Iterable[str]) -> None:
    documented = first_column_names(section(api_doc(), heading))
    expected = {str(name) for name in names}
    assert expected - documented == set(), f"{heading}: missing {expected - documented}"
    assert documented - expected == set(), f"{heading}: not in the code {documented - expected}"


@pytest.mark.parametrize(
    ("heading", "names"),
    [
        ("### Event types", [*EventType, *EVENT_DATA]),
        ("### Session event types", [*SessionEventType, *SESSION_EVENT_DATA, READY]),
        ("## Turn states", list(TurnState)),
        ("## Message statuses", list(MessageStatus)),
        ("## Action statuses", list(ActionStatus)),
        ("### Turn error codes", list(TurnErrorCode)),
        ("### Warning codes", list(WarningCode)),
    ],
)
def test_every_value_the_contract_defines_is_in_the_api_page(
    heading: str, names: list[str]
) -> None:
    assert_table_matches(heading, names)


def domain_error_codes() -> set[str]:
    found, todo = set(), [errors.ParleyError]
    while todo:
        kind = todo.pop()
        found.add(kind.code)
        todo.extend(kind.__subclasses__())
    return found


def literal_error_codes(tree: ast.AST) -> Iterator[str]:
    """String codes handed to a client: `code=` arguments, `error_body("...")`, and values
    assigned to a variable named `code`."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            values = [kw.value for kw in node.keywords if kw.arg == "code"]
            if isinstance(node.func, ast.Name) and node.func.id == "error_body":
                values += node.args[:1]
        elif isinstance(node, ast.Assign) and any(
            isinstance(target, ast.Name) and target.id == "code" for target in node.targets
        ):
            values = [c for c in ast.walk(node.value) if isinstance(c, ast.Constant)]
        else:
            continue
        for value in values:
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                yield value.value


def openapi_error_codes() -> set[str]:
    found = set()
    for operations in openapi()["paths"].values():
        for operation in operations.values():
            for answer in operation.get("responses", {}).values():
                codes = re.search(r"\(code ([^)]*)\)", str(answer.get("description", "")))
                if codes:
                    found.update(name.strip(" `") for name in codes.group(1).split(","))
    return found


def test_every_http_error_code_is_in_the_api_page() -> None:
    codes = domain_error_codes() | openapi_error_codes()
    for root in ERROR_CODE_SOURCES:
        for path in (REPO / root).rglob("*.py"):
            codes.update(literal_error_codes(ast.parse(path.read_text())))
    documented = first_column_names(section(api_doc(), "### HTTP error codes"))
    assert codes - documented == set(), f"missing from docs/api.md: {codes - documented}"
    assert documented - codes == set(), f"documented, not in the code: {documented - codes}"
