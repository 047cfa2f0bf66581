"""The import contracts of pyproject.toml ([tool.importlinter]) hold, checked in the quick tier (issue 39): no
broker, no install.  import-linter resolves ``sie.X`` by path: ``sie/`` links the root folders in, so the repository
itself is the tree it reads (tests/test_layout.py); tests/test_packaging.py checks the installed wheel too."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = REPO_ROOT / "pyproject.toml"
_LINT = "import sys; from importlinter.cli import lint_imports_command; sys.exit(lint_imports_command())"


def _import_tree(root: Path) -> Path:
    """The product's sources under their import names: a copy of sie/ with its links to the root folders followed
    (a test may add a module to it)."""
    shutil.copytree(REPO_ROOT / "sie", root / "sie", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return root


def _lint(tree: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", _LINT, "--no-cache", str(PYPROJECT)], cwd=cwd, capture_output=True,
                          text=True, timeout=240, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(tree)})


def test_every_import_contract_is_kept(tmp_path: Path) -> None:
    done = _lint(_import_tree(tmp_path / "tree"), tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 broken" in done.stdout, done.stdout


def test_the_placement_fence_forbids_threads(tmp_path: Path) -> None:
    tree = _import_tree(tmp_path / "tree")
    placement = tree / "sie" / "control" / "placement"
    (placement / "_threads_probe.py").write_text("import threading\nfrom concurrent.futures import Future\n")
    done = _lint(tree, tmp_path)
    assert done.returncode != 0, done.stdout
    assert "Control plane placement is pure" in done.stdout and "BROKEN" in done.stdout, done.stdout
    assert "sie.control.placement._threads_probe -> threading" in done.stdout, done.stdout
    assert "sie.control.placement._threads_probe -> concurrent" in done.stdout, done.stdout
