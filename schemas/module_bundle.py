"""The Python package a spec names, as one archive every node can import from: built by ``sie apply``.

A spec's ``backend.moduleClass`` or ``backend.callable`` may name code that sits next to the spec file
(``churn_rules.py``, ``mynet/model.py``): the machine that applies the spec has it, the nodes do not.
``sie apply`` packs it into a zip archive, uploads it like any artifact (by sha256), and the spec names
it in ``backend.modules``; an agent fetches and verifies it, and its worker imports the spec's module from
that archive and from nowhere else (``zipimport``: nothing is extracted, nothing is written).

What goes in: only ``.py`` files (no compiled or native code, no data files), of the subtree of the
allowed module prefix the spec's module falls under (``SIE_ALLOWED_MODULES``), plus the ``__init__.py``
of the packages above it.  The archive is deterministic (sorted entries, fixed timestamps): the same
sources give the same sha256, so applying them again uploads nothing.

``check_bundle`` is what a node runs on an archive it fetched, whoever built it: every module in it must
be one this node allows (or a package above an allowed prefix, ``__init__.py`` only), with bounded size.
The allow-list still decides which names may run; the archive only decides where their code comes from.
"""

from __future__ import annotations

import io
import zipfile
from collections.abc import Iterable
from pathlib import Path, PurePosixPath
from typing import Any

from sie.schemas.spec_policy import module_allowed

#: bounds of a module archive: a spec's own package, not a virtual environment
MAX_BUNDLE_FILES = 2000
MAX_BUNDLE_BYTES = 32 * 1024 * 1024
_FIXED_TIME = (1980, 1, 1, 0, 0, 0)


def spec_modules(backend: Any) -> list[str]:
    """The modules a backend names (``moduleClass``, ``callable``), in order, without duplicates."""
    refs = [getattr(backend, attr, None) for attr in ("module_class", "callable")]
    return list(dict.fromkeys(ref.partition(":")[0] for ref in refs if isinstance(ref, str) and ":" in ref))


def find_package_dir(module: str, search_dirs: Iterable[Path]) -> Path | None:
    """The first folder holding the module's top-level package (``pkg/``) or module (``pkg.py``): the same
    rule a worker's import uses for a spec applied from a file."""
    top = module.split(".")[0]
    for directory in search_dirs:
        if (directory / top).is_dir() or (directory / f"{top}.py").is_file():
            return directory
    return None


def _allowed_prefix(module: str, allowed: Iterable[str]) -> str | None:
    matches = [p for p in allowed if module_allowed(module, [p])]
    return min(matches, key=len) if matches else None


def bundle_files(module: str, root: Path, allowed: Iterable[str]) -> dict[str, Path]:
    """Archive name -> file of the subtree under the allowed prefix of ``module`` (see the module docstring)."""
    prefix = _allowed_prefix(module, allowed)
    if prefix is None:
        return {}
    parts = prefix.split(".")
    files: dict[str, Path] = {}
    for depth in range(1, len(parts)):
        init = root.joinpath(*parts[:depth], "__init__.py")
        if init.is_file():
            files["/".join([*parts[:depth], "__init__.py"])] = init
    package = root.joinpath(*parts)
    single = root.joinpath(*parts[:-1], f"{parts[-1]}.py")
    if package.is_dir():
        for path in sorted(package.rglob("*.py")):
            rel = path.relative_to(root)
            if any(p.startswith(".") or p == "__pycache__" for p in rel.parts) or not path.is_file():
                continue
            if path.name.startswith("__") and path.name != "__init__.py":  # __main__.py: never an entry point
                continue
            files[rel.as_posix()] = path
    elif single.is_file():
        files[single.relative_to(root).as_posix()] = single
    return files


def build_bundle(backend: Any, search_dirs: Iterable[Path], allowed: Iterable[str]) -> tuple[bytes, list[str]] | None:
    """The zip archive of the spec's own modules found in ``search_dirs`` (the spec file's folder and the
    folders above it), and the archive names; None when the spec names no module found there (an installed
    package: nodes import it from their environment, as before)."""
    allowed = tuple(allowed)
    dirs = list(search_dirs)
    files: dict[str, Path] = {}
    for module in spec_modules(backend):
        root = find_package_dir(module, dirs)
        if root is not None:
            files.update(bundle_files(module, root, allowed))
    if not files:
        return None
    if len(files) > MAX_BUNDLE_FILES:
        raise ValueError(f"spec.backend: the package next to the spec has {len(files)} .py files, more than "
                         f"{MAX_BUNDLE_FILES}; narrow SIE_ALLOWED_MODULES to the model's own package")
    total = sum(p.stat().st_size for p in files.values())
    if total > MAX_BUNDLE_BYTES:
        raise ValueError(f"spec.backend: the package next to the spec holds {total} bytes of .py files, more "
                         f"than {MAX_BUNDLE_BYTES}; narrow SIE_ALLOWED_MODULES to the model's own package")
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as archive:
        for name in sorted(files):
            info = zipfile.ZipInfo(name, date_time=_FIXED_TIME)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            archive.writestr(info, files[name].read_bytes())
    return out.getvalue(), sorted(files)


def module_of(name: str) -> tuple[str, bool] | None:
    """``a/b/__init__.py`` -> (``a.b``, True); ``a/b/c.py`` -> (``a.b.c``, False); anything else None."""
    path = PurePosixPath(name)
    if path.is_absolute() or not name.endswith(".py") or any(p in ("", ".", "..") for p in path.parts):
        return None
    parts = list(path.parts)
    is_init = parts[-1] == "__init__.py"
    parts = parts[:-1] if is_init else [*parts[:-1], parts[-1][:-3]]
    if not parts or not all(p.isidentifier() and not p.startswith("__") for p in parts):
        return None
    return ".".join(parts), is_init


def check_bundle(path: Path, allowed: Iterable[str]) -> list[str]:
    """What is wrong with a module archive on this node (empty: it may be imported from)."""
    allowed = tuple(allowed)
    what = "spec.backend.modules"
    try:
        with zipfile.ZipFile(path) as archive:
            infos = archive.infolist()
    except (OSError, zipfile.BadZipFile) as exc:
        return [f"{what}: not a zip archive of Python sources ({exc})"]
    if len(infos) > MAX_BUNDLE_FILES:
        return [f"{what}: {len(infos)} entries, more than {MAX_BUNDLE_FILES}"]
    if sum(i.file_size for i in infos) > MAX_BUNDLE_BYTES:
        return [f"{what}: more than {MAX_BUNDLE_BYTES} bytes uncompressed"]
    problems = []
    for info in infos:
        if info.is_dir():
            continue
        found = module_of(info.filename)
        if found is None:
            problems.append(f"{what}: entry {info.filename[:100]!r} is not a Python source of a module")
            continue
        module, is_init = found
        above = is_init and any(p.startswith(module + ".") for p in allowed)
        if not module_allowed(module, allowed) and not above:
            problems.append(f"{what}: holds module {module!r}, outside this node's allowed modules "
                            f"({', '.join(allowed) or 'none'}); set SIE_ALLOWED_MODULES on every node")
        if len(problems) >= 5:
            break
    return problems
