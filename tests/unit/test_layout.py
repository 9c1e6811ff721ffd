"""The layout is the architecture: sizes, layers and import cycles of the product code, and
the tiers of the tests.

These read the source with `ast`; nothing is imported or run. A failure names the module,
function or import that broke the rule, so the fix is a refactor, not a tweak of the test.
"""

from __future__ import annotations

import ast
import re
import tomllib
from functools import cache
from pathlib import Path

import pytest

from tests.support.layout import PACKAGES, REPO, TOP_MODULES, product_files

MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 60

# The domain package is pure: rules and contracts, no I/O layers and no wiring.
DOMAIN = "parley"
COMPONENTS = {name.rsplit(".", 1)[-1] for name in [*PACKAGES.values(), *TOP_MODULES.values()]}
DOMAIN_MAY_NOT_IMPORT = ("store", "api", "activities", "workflows", "worker", "launch", "dispatch")

# Workflow code is deterministic orchestration: it never reaches for a database or the web.
WORKFLOWS_MAY_NOT_IMPORT = ("sqlalchemy", "psycopg", "fastapi", "httpx", "store", "api")

# The database has one home: only `store` (its migrations included) speaks SQLAlchemy or
# psycopg; everything else calls its named functions and names its types (`store.db.Db`).
DATABASE_LIBRARIES = ("sqlalchemy", "psycopg")
DATABASE_HOME = "store"
# Outside the store, code works with typed rows (dataclasses, pydantic models) that the
# store hands it: nothing holds an ORM object that it could read lazily or mutate behind the
# store's back (the API's routes, the worker's activities, the wiring alike).
ORM_MODELS = "parley.store.models"
READS_TYPED_ROWS = tuple(
    name.rsplit(".", 1)[-1] for name in PACKAGES.values() if not name.endswith(DATABASE_HOME)
)


def _module_name(path: Path) -> str:
    """The name a file is imported by: installed (`api/main.py` is `parley.api.main`), or
    its path's for the rest (`tests.support.client`)."""
    relative = path.relative_to(REPO)
    if str(relative) in TOP_MODULES:
        return TOP_MODULES[str(relative)]
    parts = list(relative.with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    if parts[0] in PACKAGES:
        parts[0:1] = PACKAGES[parts[0]].split(".")
    return ".".join(parts)


@cache  # a dozen rules read every file's imports: each file is parsed once
def _imports(path: Path) -> frozenset[str]:
    """Every module a file imports, at any depth, except under `if TYPE_CHECKING:`."""
    tree = ast.parse(path.read_text())
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(child) for child in ast.walk(node))
    found: set[str] = set()
    package = _module_name(path).rsplit(".", 1)[0] if "." in _module_name(path) else ""
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join([*base, node.module] if node.module else base)
            else:
                module = node.module or ""
            found.add(module)
            # `from store import chat` imports the submodule `store.chat`.
            found.update(f"{module}.{alias.name}" for alias in node.names)
    return frozenset(found)


FILES = list(product_files())
MODULES = {_module_name(path): path for path in FILES}


TESTS = REPO / "tests"
# Each test module lives in one tier (see each tier's conftest.py); `make test-fast` runs the
# first three. What several modules share is in tests/support or a conftest.py, never in
# another test module.
TIERS = ("unit", "workflow", "replay", "api", "system", "web", "node")
TEST_FILES = sorted(TESTS.rglob("*.py"))


def _is_test_module(module: str) -> bool:
    return module.rsplit(".", 1)[-1].startswith("test_")


def _top(module: str) -> str:
    """The component a module is part of (`parley.store.db`: `store`), or its top-level
    package if it is not Parley's (`sqlalchemy`)."""
    parts = module.split(".")
    if parts[0] == DOMAIN and len(parts) > 1 and parts[1] in COMPONENTS:
        return parts[1]
    return parts[0]


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(REPO)))
def test_modules_and_functions_stay_small(path: Path) -> None:
    lines = len(path.read_text().splitlines())
    assert lines <= MAX_MODULE_LINES, f"{path.name} has {lines} lines; split it along a seam"
    long = [
        f"{node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.end_lineno is not None
        and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES
    ]
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines in {path.name}: {long}"


# The pages' own scripts (vendored libraries aside) are held to the same length.
SCRIPTS = sorted((REPO / "api" / "web" / "js").glob("*.js"))


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: p.name)
def test_the_pages_scripts_stay_small(path: Path) -> None:
    lines = len(path.read_text().splitlines())
    assert lines <= MAX_MODULE_LINES, f"{path.name} has {lines} lines; split it along a seam"


def test_the_script_rule_sees_the_pages() -> None:
    assert {"app.js", "transcript.js", "state.js"} <= {p.name for p in SCRIPTS}


def test_the_domain_package_imports_no_io_layer() -> None:
    offending = {
        f"{name} imports {imported}"
        for name, path in MODULES.items()
        if _top(name) == DOMAIN
        for imported in _imports(path)
        if _top(imported) in DOMAIN_MAY_NOT_IMPORT
    }
    assert not offending, sorted(offending)


def test_workflow_code_imports_no_database_or_web_library() -> None:
    offending = {
        f"{name} imports {imported}"
        for name, path in MODULES.items()
        if _top(name) == "workflows"
        for imported in _imports(path)
        if _top(imported) in WORKFLOWS_MAY_NOT_IMPORT
    }
    assert not offending, sorted(offending)


def test_no_route_module_imports_another() -> None:
    """One router per resource: what two routes share lives beside them in api/ (deps,
    delivery, schemas), never in one of the routes."""
    routes = "parley.api.routes."
    offending = {
        f"{name} imports {imported}"
        for name, path in MODULES.items()
        if name.startswith(routes)
        for imported in _imports(path)
        if imported.startswith(routes) and imported.split(".")[3] != name.split(".")[3]
    }
    assert not offending, sorted(offending)


def test_only_the_store_imports_a_database_library() -> None:
    offending = {
        f"{name} imports {imported}"
        for name, path in MODULES.items()
        if _top(name) != DATABASE_HOME
        for imported in _imports(path)
        if _top(imported) in DATABASE_LIBRARIES
    }
    assert not offending, sorted(offending)


def test_only_the_store_holds_orm_models() -> None:
    offending = {
        f"{name} imports {imported}"
        for name, path in MODULES.items()
        if _top(name) in READS_TYPED_ROWS or _top(name) == "worker"
        for imported in _imports(path)
        if imported == ORM_MODELS or imported.startswith(f"{ORM_MODELS}.")
    }
    assert not offending, sorted(offending)


# One access style in store/ (store/db.py): every statement is a named SQL string sent through
# a `Db`. SQLAlchemy is the pool (store/db.py), the schema (store/models) and alembic's
# migrations (store/migrate.py); no other module of store/ imports it or queries through the
# models.
SQLALCHEMY_IN_STORE = (f"{DOMAIN}.store.db", f"{DOMAIN}.store.migrate", ORM_MODELS)


def _speaks_sqlalchemy(name: str) -> bool:
    return any(name == home or name.startswith(f"{home}.") for home in SQLALCHEMY_IN_STORE)


def test_the_store_sends_every_statement_one_way() -> None:
    offending = {
        f"{name} imports {imported}"
        for name, path in MODULES.items()
        if _top(name) == DATABASE_HOME and not _speaks_sqlalchemy(name)
        for imported in _imports(path)
        if _top(imported) == "sqlalchemy" or imported.startswith(ORM_MODELS)
    }
    assert not offending, sorted(offending)


def test_the_database_rule_sees_the_store() -> None:
    """Guards the guard: the store's own imports of the libraries are found."""
    assert "sqlalchemy" in {_top(m) for m in _imports(MODULES["parley.store.db"])}
    assert "psycopg" in {_top(m) for m in _imports(MODULES["parley.store.listener"])}
    assert any(m.startswith(ORM_MODELS) for m in _imports(MODULES["parley.store.models.memory"]))


def test_there_is_no_import_cycle() -> None:
    graph = {
        name: {imported for imported in _imports(path) if imported in MODULES and imported != name}
        for name, path in MODULES.items()
    }
    cycle = _find_cycle(graph)
    assert cycle is None, " -> ".join(cycle or [])


def _find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    visiting: list[str] = []
    done: set[str] = set()

    def visit(node: str) -> list[str] | None:
        if node in visiting:
            return [*visiting[visiting.index(node) :], node]
        if node in done:
            return None
        visiting.append(node)
        for nxt in sorted(graph[node]):
            found = visit(nxt)
            if found:
                return found
        visiting.pop()
        done.add(node)
        return None

    for start in sorted(graph):
        found = visit(start)
        if found:
            return found
    return None


def test_the_layout_test_sees_the_product() -> None:
    """Guards the guard: a renamed package must not make every check above vacuous."""
    tops = {_top(name) for name in MODULES}
    assert COMPONENTS | {DOMAIN} <= tops
    assert len(FILES) > 40
    package_dir = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert {name: folder for folder, name in PACKAGES.items()} == package_dir["package-dir"]


# Run from a checkout, `import store` still finds the folder (the checkout is on sys.path for
# the tests and the bench), but an install has no top-level `store`: only `parley.store`.
FOLDER_NAMES = {*PACKAGES, *(name.removesuffix(".py") for name in TOP_MODULES)} - {DOMAIN}
BENCH_FILES = sorted((REPO / "bench").rglob("*.py"))


def test_every_import_names_a_component_by_its_installed_name() -> None:
    offending = sorted(
        f"{path.relative_to(REPO)} imports {imported}"
        for path in [*FILES, *TEST_FILES, *BENCH_FILES]
        for imported in _imports(path)
        if imported.split(".", 1)[0] in FOLDER_NAMES
    )
    assert not offending, offending


def test_no_test_module_imports_another_test_module_or_a_conftest() -> None:
    """Shared fixtures live in a tier's conftest.py (pytest finds them), shared helpers in
    tests/support; a test module imported by another runs its fixtures and tests twice."""
    offending = sorted(
        f"{path.relative_to(REPO)} imports {imported}"
        for path in TEST_FILES
        for imported in _imports(path)
        if imported.startswith("tests.")
        and (_is_test_module(imported) or imported.rsplit(".", 1)[-1] == "conftest")
    )
    assert not offending, offending


def test_every_test_module_lives_in_a_tier_and_every_tier_has_its_conftest() -> None:
    misplaced = [
        str(path.relative_to(REPO))
        for path in TEST_FILES
        if path.name.startswith("test_")
        and path.parent.relative_to(TESTS).parts[:1] not in [(tier,) for tier in TIERS]
    ]
    assert not misplaced, f"move these into one of tests/{{{','.join(TIERS)}}}: {misplaced}"
    assert all((TESTS / tier / "conftest.py").is_file() for tier in TIERS)


def test_the_import_rule_sees_the_tests() -> None:
    """Guards the guard: the test files are found and their imports read."""
    assert len([p for p in TEST_FILES if p.name.startswith("test_")]) > 60
    assert "tests.support.client" in _imports(TESTS / "api" / "test_smoke.py")


# One owner per invariant of the record: each is written in one module of store/, and a
# statement elsewhere that needs it (one round trip doing several things) composes the owner's
# named SQL fragments instead of writing it again.
#
# The check reads the text of the product code (every package `pip install` ships and
# worker.py; not tests, migrations or bench/) for each invariant's greppable forms, so a
# second copy, in SQL or through the ORM, names the module that wrote it. Prose that spells
# a form out counts too: say "the doorbell", not the function's name, outside its owner.

# invariant: (its owner, the forms that write it)
OWNERS: dict[str, tuple[str, tuple[str, ...]]] = {
    # An event is appended (its id taken from the turn's counter) in one place.
    "the event append": ("store/events.py", (r"INSERT INTO turn_events",)),
    # A session's own event (its id taken from the session's counter) likewise.
    "the session event append": (
        "store/live.py",
        (r"INSERT INTO session_events", r"last_event_id = sessions\.last_event_id"),
    ),
    # Every NOTIFY, with its payload's format: the event log's doorbell and the outbox's.
    "a doorbell": ("store/events.py", (r"pg_notify",)),
    # A turn's state changes in one UPDATE (and a turn is born by one INSERT); through the
    # ORM, a `Turn`'s state is never assigned.
    "a turn's state": (
        "store/turn_states.py",
        (r"UPDATE turns SET state", r"INSERT INTO turns\b", r"\bturn\.state = "),
    ),
    # An advisory lock (a user's turns, a user's streams, a session's summary): its SQL and
    # its keys in one module.
    "an advisory lock": ("store/locks.py", (r"pg_advisory",)),
    # A message's seq: the session's `last_seq` moves by one, or to the seq a message took,
    # in SQL or on the ORM row (alone or in a tuple assignment).
    "the message seq": (
        "store/messages.py",
        (
            r"last_seq \+",
            r"SET last_seq",
            r"last_seq = %\(",
            r"\.last_seq \+?= ",
            r"\.last_seq,.* = ",
        ),
    ),
}


TEXTS = {str(path.relative_to(REPO)): path.read_text() for path in FILES}


def writers(forms: tuple[str, ...], files: dict[str, str] = TEXTS) -> set[str]:
    """The modules whose text holds any of `forms`."""
    return {name for name, text in files.items() if any(re.search(f, text) for f in forms)}


@pytest.mark.parametrize("invariant", sorted(OWNERS))
def test_each_invariant_is_written_in_its_owner_alone(invariant: str) -> None:
    owner, forms = OWNERS[invariant]
    assert writers(forms) == {owner}, f"{invariant} belongs to {owner} alone"


def test_the_owner_check_sees_a_second_copy() -> None:
    """Guards the guard: a copy of each form outside its owner is found, and the product's
    files are read at all."""
    assert "store/events.py" in TEXTS and "tests/unit/test_layout.py" not in TEXTS
    copies = {
        "INSERT INTO turn_events (turn_id, id)": "the event append",
        "INSERT INTO session_events (session_id, id)": "the session event append",
        "SET last_event_id = sessions.last_event_id + 1": "the session event append",
        "SELECT pg_notify('parley_outbox', %(id)s)": "a doorbell",
        "UPDATE turns SET state = 'completed'": "a turn's state",
        "turn.state = TurnState.failed": "a turn's state",
        "SELECT pg_advisory_xact_lock(hashtext(%(key)s))": "an advisory lock",
        "session.last_seq += 1": "the message seq",
        "session.last_seq, session.active_turn_id = seq, turn_id": "the message seq",
        "UPDATE sessions SET active_turn_id = %(t)s, last_seq = %(seq)s": "the message seq",
        "UPDATE sessions SET last_seq = last_seq + 1": "the message seq",
    }
    for text, invariant in copies.items():
        owner, forms = OWNERS[invariant]
        found = writers(forms, {owner: "", "store/elsewhere.py": f"x = '''{text}'''"})
        assert found == {"store/elsewhere.py"}, text
