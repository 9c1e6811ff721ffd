"""What `pip install .` puts in site-packages: the wheel, built from a copy of the files the
build reads, holds one package, `parley`, with every file of the product's folders at its
installed name, and nothing else beside its dist-info (issue 40).

A few seconds: pip builds the wheel in a subprocess, with setuptools from the package index.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
# Installed name -> the folder it is built from.
PACKAGE_DIR: dict[str, str] = PYPROJECT["tool"]["setuptools"]["package-dir"]
# What the build reads beside the folders.
BUILD_FILES = ("pyproject.toml", "setup.py", "README.md", "worker.py")


def _copy_product(target: Path) -> None:
    """The files the build reads, as a fresh checkout has them (no editable install's link,
    no bytecode)."""

    def skipped(folder: str, names: list[str]) -> set[str]:
        return {
            name
            for name in names
            if name == "__pycache__" or name.endswith(".pyc") or Path(folder, name).is_symlink()
        }

    for name in BUILD_FILES:
        shutil.copy2(REPO / name, target / name)
    for folder in PACKAGE_DIR.values():
        shutil.copytree(REPO / folder, target / folder, ignore=skipped)


def _expected_files() -> set[str]:
    """Every file of the product's folders at its installed path, and worker.py: a
    subpackage left out of pyproject.toml's list, or data its package-data misses, is
    missing from the wheel."""
    expected = {"parley/worker.py"}
    for name, folder in PACKAGE_DIR.items():
        installed = Path(*name.split("."))
        for path in (REPO / folder).rglob("*"):
            relative = path.relative_to(REPO / folder)
            if path.is_dir() or path.is_symlink() or "__pycache__" in relative.parts:
                continue
            if path.name == "README.md":
                continue  # a folder's notes for whoever updates it (api/web/vendor/)
            expected.add(str(installed / relative))
    return expected


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> zipfile.ZipFile:
    source = tmp_path_factory.mktemp("source")
    out = tmp_path_factory.mktemp("wheel")
    _copy_product(source)
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(out), "."],
        cwd=source,
        check=True,
        capture_output=True,
        timeout=300,
    )
    (built,) = out.glob("parley-*.whl")
    return zipfile.ZipFile(built)


def test_the_wheel_installs_one_top_level_package(wheel: zipfile.ZipFile) -> None:
    version = PYPROJECT["project"]["version"]
    tops = {name.split("/", 1)[0] for name in wheel.namelist()}
    assert tops == {"parley", f"parley-{version}.dist-info"}


def test_the_wheel_holds_every_product_file_at_its_installed_name(
    wheel: zipfile.ZipFile,
) -> None:
    installed = {name for name in wheel.namelist() if not name.split("/")[0].endswith("dist-info")}
    expected = _expected_files()
    assert not expected - installed, f"left out of the wheel: {sorted(expected - installed)}"
    assert not installed - expected, f"in the wheel from nowhere: {sorted(installed - expected)}"


def test_worker_py_is_installed_as_parley_worker(wheel: zipfile.ZipFile) -> None:
    assert wheel.read("parley/worker.py") == (REPO / "worker.py").read_bytes()


def test_the_parley_command_runs_the_installed_cli(wheel: zipfile.ZipFile) -> None:
    (entry_points,) = [n for n in wheel.namelist() if n.endswith(".dist-info/entry_points.txt")]
    scripts = wheel.read(entry_points).decode()
    assert "parley = parley.launch.cli:main" in scripts.splitlines()
