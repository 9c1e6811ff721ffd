"""The typed client (clients/typescript, docs/features/typed-client.md): the committed
`parley.d.ts` is what the pinned openapi-typescript makes of the code's OpenAPI document
now; the page's example compiles with `tsc --noEmit` (strict) against it, a wrong call does
not, and the example runs one turn with Node against the test stack."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
from asyncio.subprocess import PIPE
from pathlib import Path

import pytest

from parley.launch.client import client_document
from tests.support.client import ParleyClient
from tests.support.npm import installed
from tests.support.stack import REPO

PACKAGE = REPO / "clients" / "typescript"
PAGE = REPO / "docs" / "features" / "typed-client.md"


@pytest.fixture(scope="module")
def node_modules() -> Path:
    return installed(PACKAGE) / "node_modules"


@pytest.fixture
def project(tmp_path: Path, node_modules: Path) -> Path:
    """A folder as a user of the client has it: the types, the config, the packages."""
    for name in ("parley.d.ts", "tsconfig.json", "package.json"):
        shutil.copy(PACKAGE / name, tmp_path / name)
    (tmp_path / "node_modules").symlink_to(node_modules)
    return tmp_path


async def run(*args: str, cwd: Path, env: dict[str, str] | None = None) -> tuple[int, str]:
    process = await asyncio.create_subprocess_exec(
        *args, cwd=cwd, env=env, stdout=PIPE, stderr=asyncio.subprocess.STDOUT
    )
    out, _ = await asyncio.wait_for(process.communicate(), timeout=120)
    assert process.returncode is not None
    return process.returncode, out.decode(errors="replace")


async def test_the_committed_client_is_what_the_document_makes_now(
    project: Path, tmp_path: Path
) -> None:
    document = tmp_path / "openapi.json"
    document.write_text(json.dumps(client_document(), indent=1, sort_keys=True) + "\n")
    made = tmp_path / "made.d.ts"
    # The package's own script: the flags `make client` uses.
    code, out = await run(
        "npm", "run", "--silent", "types", "--", str(document), "-o", str(made), cwd=project
    )
    assert code == 0, out
    assert made.read_text() == (PACKAGE / "parley.d.ts").read_text(), (
        "clients/typescript/parley.d.ts differs from the OpenAPI document: run `make client`"
    )


def example() -> str:
    [code] = re.findall(r"```ts\n(.*?)```", PAGE.read_text(), flags=re.S)
    return code


async def test_the_example_compiles_a_wrong_call_does_not_and_one_turn_runs(
    project: Path, api_url: str, tokens: dict[str, str], priya: ParleyClient
) -> None:
    tsc = str(project / "node_modules" / ".bin" / "tsc")
    (project / "example.ts").write_text(example())
    code, out = await run(tsc, "--noEmit", "-p", ".", cwd=project)
    assert code == 0, out

    # The types hold: a path parameter misnamed and a required field left out are errors.
    wrong = example().replace(
        "params: { path: { session_id } },\n  body", "params: { path: { id: session_id } },\n  body"
    )
    wrong = wrong.replace("client_message_id: crypto.randomUUID(), ", "")
    (project / "example.ts").write_text(wrong)
    code, out = await run(tsc, "--noEmit", "-p", ".", cwd=project)
    assert code != 0 and "session_id" in out and "client_message_id" in out, out

    (project / "example.ts").write_text(example())
    # Checked above: emitted as it is.
    code, out = await run(
        tsc, "-p", ".", "--noEmit", "false", "--noCheck", "--outDir", "out", cwd=project
    )
    assert code == 0, out
    env = {"PATH": "/usr/bin:/bin", "PARLEY_URL": api_url, "PARLEY_TOKEN": tokens["priya"]}
    code, out = await run("node", "out/example.js", cwd=project, env=env)
    assert code == 0, out
    printed = json.loads(out.strip().splitlines()[-1])
    assert printed["ended"] == "done", printed
    stored = [m for m in await priya.messages(printed["session_id"]) if m["role"] == "assistant"]
    assert printed["answer"] and printed["answer"] == stored[-1]["text"]
