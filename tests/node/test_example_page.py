"""The useChat example page's committed bundle (api/web/examples/use-chat.js, what `make run`
serves) is what its source builds to: the pinned esbuild bundles examples/use-chat/src again,
with the pinned packages, and the result is the committed file byte for byte. A source edit
without `make example-page` fails here."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from tests.support import npm
from tests.support.stack import REPO

EXAMPLE = REPO / "examples" / "use-chat"
BUILT = REPO / "api" / "web" / "examples"
OUTPUTS = ("use-chat.js", "use-chat.js.LEGAL.txt")


def test_the_committed_bundle_is_what_the_source_builds_to(tmp_path: Path) -> None:
    installed = npm.installed(EXAMPLE)
    # The source as committed, beside the installed packages (esbuild finds them by walking
    # up from each file, as in examples/use-chat).
    shutil.copytree(EXAMPLE / "src", tmp_path / "src")
    shutil.copy(EXAMPLE / "package.json", tmp_path / "package.json")
    (tmp_path / "node_modules").symlink_to(installed / "node_modules")
    out = tmp_path / "out"
    built = subprocess.run(
        ["npm", "run", "--silent", "bundle", "--", f"--outfile={out / 'use-chat.js'}"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert built.returncode == 0, built.stderr
    for name in OUTPUTS:
        fresh, committed = (out / name).read_bytes(), (BUILT / name).read_bytes()
        assert fresh == committed, (
            f"api/web/examples/{name} is not what examples/use-chat/src builds to "
            f"({len(fresh)} bytes built, {len(committed)} committed): run `make example-page`"
        )
