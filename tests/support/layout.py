"""Where the product's source lives, for the tests that read it (tests/unit/test_layout.py
reads its layers and sizes; tests/unit/test_tls.py its HTTP clients)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# Product folders (what `pip install` ships) and the wiring module at the root, with the names
# they are installed under: each folder a subpackage of `parley` (pyproject.toml's
# package-dir), worker.py the module `parley.worker` (setup.py). test_layout's rules name a
# component by the last part of its installed name: `store`, `eval`, `worker`.
PACKAGES = {
    "api": "parley.api",
    "workflows": "parley.workflows",
    "activities": "parley.activities",
    "parley": "parley",
    "store": "parley.store",
    "gateway": "parley.gateway",
    "demo_backend": "parley.demo_backend",
    "dispatch": "parley.dispatch",
    "launch": "parley.launch",
    "parley_eval": "parley.eval",
}
TOP_MODULES = {"worker.py": "parley.worker"}


def product_files() -> Iterator[Path]:
    """Every product module's file (migrations and the editable install's links left out)."""
    for package in PACKAGES:
        root = REPO / package
        if not root.is_dir():
            continue
        for path in sorted(root.rglob("*.py")):
            # An editable install links parley/worker.py to worker.py: not a module of its own.
            if "migrations" not in path.parts and not path.is_symlink():
                yield path
    for name in TOP_MODULES:
        yield REPO / name
