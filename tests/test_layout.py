"""Where a module lives: one rule, ``sie.a.b`` is the file ``sie/a/b.py`` (or ``sie/a/b/__init__.py``) from the
repository root (docs/architecture.md, "Where a module lives").

The design card's folders stay at the root; ``sie/`` links each one in (``sie/streams -> ../streams``), so the rule
holds for every module, and a tool that follows an import by its path (an IDE without the install, import-linter,
a structure viewer) reaches the code. These tests keep the links, the wheel's package-dir map and the imports in
step: a new root folder without its link, a link to the wrong folder, or an import the rule cannot find fails here.
"""

from __future__ import annotations

import ast
import os
import tomllib
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
SETUPTOOLS = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
ROOMS = {name.split(".", 1)[1]: folder for name, folder in SETUPTOOLS["package-dir"].items() if name != "sie"}


def _file_of(module: str) -> Path | None:
    """The rule itself: the path of ``module`` from the repository root, or None when nothing is there."""
    base = REPO_ROOT.joinpath(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _product_files() -> list[Path]:
    """Every product module, walked through the links (os.walk does not follow them by itself)."""
    out: list[Path] = []
    for top, dirs, files in os.walk(REPO_ROOT / "sie", followlinks=True):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        out += [Path(top) / f for f in files if f.endswith(".py")]
    return out


def test_each_root_folder_of_the_wheel_is_linked_into_sie() -> None:
    links = {p.name: os.readlink(p) for p in (REPO_ROOT / "sie").iterdir() if p.is_symlink()}
    assert links == {room: f"../{folder}" for room, folder in ROOMS.items()}, (
        "sie/ must link every folder of [tool.setuptools.package-dir] in, and nothing else: "
        f"links {links}, map {ROOMS}")


def test_every_listed_package_is_found_by_the_rule() -> None:
    missing = [p for p in SETUPTOOLS["packages"] if _file_of(p) is None or _file_of(p).name != "__init__.py"]
    assert not missing, f"packages the rule does not find at sie/<dotted path>/__init__.py: {missing}"


def test_every_product_import_of_sie_is_found_by_the_rule() -> None:
    unresolved: list[str] = []
    files = _product_files()
    assert len(files) > 200, f"the walk through sie/'s links found only {len(files)} modules"
    for path in files:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module] if isinstance(node, ast.ImportFrom) and node.module and not node.level
                     else [])
            for name in names:
                if name == "sie" or name.startswith("sie."):
                    # ``from sie.a import b`` names a module or a name in sie/a: the module must be there
                    if _file_of(name) is None:
                        unresolved.append(f"{path.relative_to(REPO_ROOT)}: {name}")
    assert not unresolved, "imports the rule sie.a.b -> sie/a/b.py cannot follow:\n" + "\n".join(unresolved)


def test_no_room_is_reachable_under_two_names() -> None:
    """A root folder is a room of sie only: nothing links it twice, and no room has a link of its own inside."""
    targets = [os.path.realpath(REPO_ROOT / "sie" / room) for room in ROOMS]
    assert len(set(targets)) == len(targets)
    inner = [str(p) for room in ROOMS for p in (REPO_ROOT / ROOMS[room]).rglob("*") if p.is_symlink()]
    assert not inner, f"links inside a room would give its modules a second path: {inner}"
