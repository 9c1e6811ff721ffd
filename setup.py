"""Installs the root's worker.py, the wiring, as the module `parley.worker`.

Everything else about the distribution is in pyproject.toml, whose `package-dir` maps each
component's folder into the `parley` package. A module cannot be mapped that way, so building
the Python files also copies worker.py into the `parley` package. An editable install
(`pip install -e .`) copies nothing: setuptools' import hook finds each mapped folder, and
`parley.worker` is a link to the root file written beside the `parley` package's own modules
(git ignores it), which is where setuptools asks a build step to put what it adds to a
package in editable mode.
"""

from __future__ import annotations

import os
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
# (package, module, source file relative to the root), as build_py lists its modules.
WORKER = ("parley", "worker", "worker.py")


class BuildPy(build_py):
    def find_all_modules(self) -> list[tuple[str, str, str]]:
        # What the wheel holds, its RECORD and an sdist's sources all come from this list (the
        # editable install's link in the package is not a module of its own).
        found = [entry for entry in super().find_all_modules() if entry[:2] != WORKER[:2]]
        return [*found, WORKER]

    def build_packages(self) -> None:
        super().build_packages()
        package, module, source = WORKER
        self.build_module(module, source, package)

    def run(self) -> None:
        if self.editable_mode:
            self._link_in_place()
        super().run()

    def _link_in_place(self) -> None:
        package, module, source = WORKER
        link = ROOT / self.get_package_dir(package) / f"{module}.py"
        target = os.path.relpath(ROOT / source, link.parent)
        if link.is_symlink() and os.readlink(link) == target:
            return
        link.unlink(missing_ok=True)
        link.symlink_to(target)


setup(cmdclass={"build_py": BuildPy})
