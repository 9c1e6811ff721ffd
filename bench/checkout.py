"""Run a module of another checkout of Parley with this virtualenv: `python bench/checkout.py
ROOT -m MODULE ARGS...`, for a bench section that measures an older commit beside the
current one on the same machine (bench/stream_scale.py).

The editable install maps each `parley.*` package to a folder of this checkout (setuptools'
finder, its `MAPPING`); this launcher points the same names at ROOT's folders before anything
of Parley is imported, then runs the module as `python -m` would. The dependencies are this
virtualenv's, so ROOT must be a commit whose requirements it still meets. Run as a script
(not `-m bench...`): ROOT's own `bench` need not have this file.
"""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent


def point_at(root: Path) -> None:
    """Every `parley.*` folder the editable install maps under this checkout, under `root`."""
    finders = [m for name, m in sys.modules.items() if name.startswith("__editable___parley")]
    if not finders:
        raise SystemExit("no editable install of parley in this virtualenv")
    for finder in finders:
        mapping: dict[str, str] = finder.MAPPING
        for package, folder in mapping.items():
            path = Path(folder)
            if path.is_relative_to(HERE):
                mapping[package] = str(root / path.relative_to(HERE))


def main() -> None:
    if len(sys.argv) < 4 or sys.argv[2] != "-m":
        raise SystemExit("usage: checkout.py ROOT -m MODULE [ARGS...]")
    root, module = Path(sys.argv[1]).resolve(), sys.argv[3]
    point_at(root)
    sys.path[0] = str(root)  # as `python -m` from ROOT: its top-level modules, not bench/
    sys.argv = [module, *sys.argv[4:]]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
