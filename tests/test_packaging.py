"""One import root, checked on what `pip install .` really installs (not on the source tree).

* the wheel holds nothing but ``sie/`` and its metadata: no generic top-level name (``streams``,
  ``models``, ``schemas`` ...) reaches site-packages;
* in a fresh virtualenv, ``import sie.streams`` and its siblings work from the installed copy and
  ``import streams`` / ``models`` / ``schemas`` fail;
* the explicit package list in pyproject.toml names every folder that has an ``__init__.py``;
* the package data a run needs (Kafka's pom, Avro schemas, the demo's specs and models) is installed;
* the layers hold (import-linter's contracts in pyproject.toml): everything imports downward, and the
  exactly-once layer imports none of its users.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
import venv
import zipfile
from pathlib import Path

import pytest

from tests.support.helpers import REPO_ROOT

pytestmark = pytest.mark.packaging

PYPROJECT = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
SETUPTOOLS = PYPROJECT["tool"]["setuptools"]


def _run(cmd: list[str], cwd: Path, **kwargs: object) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=300, **kwargs)  # type: ignore[call-overload]
    assert done.returncode == 0, f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}"
    return done


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    # --no-build-isolation: build with the installed setuptools (no download; the same one CI installs)
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out), "."],
         REPO_ROOT)
    (found,) = out.glob("sie-*.whl")
    return found


def test_the_wheel_installs_only_the_sie_import_root(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    tops = {name.split("/", 1)[0] for name in names}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"sie"}, sorted(tops)


def test_the_wheel_carries_what_a_run_needs_without_a_checkout(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    for needed in ("sie/infra/kafka/pom.xml", "sie/infra/kafka/log4j2.properties",
                   "sie/schemas/avro/ModelSpecRecord.avsc", "sie/schemas/json/request.schema.json",
                   "sie/examples/fraud-scorer.yaml", "sie/examples/article/model-spec.yaml",
                   "sie/examples/models/fraud/fraud_scorer.pt", "sie/examples/models/fraud/rules.py",
                   "sie/infra/prometheus/sie-rules.yml", "sie/infra/grafana/sie-overview.json",
                   "sie/control/api/static/status.html", "sie/control/api/static/status.js"):
        assert needed in names, f"{needed} missing from the wheel"


def test_package_list_names_every_package_folder() -> None:
    mapping: dict[str, str] = SETUPTOOLS["package-dir"]
    listed = set(SETUPTOOLS["packages"])
    found = set()
    for package, folder in mapping.items():
        root = REPO_ROOT / folder
        for init in root.rglob("__init__.py"):
            rel = init.parent.relative_to(root)
            dotted = ".".join((package, *rel.parts)) if rel.parts else package
            # sub-packages of another mapped folder (sie.streams under sie/) are that folder's
            if not any(dotted.startswith(other + ".") or dotted == other
                       for other in mapping if other != package and other.startswith(package + ".")):
                found.add(dotted)
    assert found == listed, f"missing from pyproject: {sorted(found - listed)}; stale: {sorted(listed - found)}"


def test_fresh_virtualenv_imports_sie_and_no_generic_names(wheel: Path, tmp_path: Path) -> None:
    env_dir = tmp_path / "venv"
    # system site-packages: torch & co. come from the machine; only SIE is installed into the venv
    venv.EnvBuilder(system_site_packages=True, with_pip=False).create(env_dir)
    python = env_dir / "bin" / "python"
    _run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps", str(wheel)], tmp_path)
    ok = _run([str(python), "-c",
               "import sie.streams, sie.workers, sie.schemas, sie.connectors, sie.infra.kafka, sie.kernel.settings;"
               "print(sie.streams.__file__)"], tmp_path)
    assert str(env_dir) in ok.stdout, f"sie.streams came from {ok.stdout.strip()}, not the fresh install"
    for generic in ("streams", "control", "models", "schemas", "workers", "connectors", "infra", "examples"):
        done = subprocess.run([str(python), "-c", f"import {generic}"], cwd=tmp_path, capture_output=True,
                              text=True, timeout=60)
        assert done.returncode != 0 and "ModuleNotFoundError" in done.stderr, f"import {generic} did not fail"


def test_layers_hold(tmp_path: Path) -> None:
    """import-linter over an installed copy (it walks real folders, so not over the editable mapping)."""
    target = tmp_path / "site"
    _run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--target",
          str(target), "."], REPO_ROOT)
    lint = "import sys; from importlinter.cli import lint_imports_command; sys.exit(lint_imports_command())"
    done = subprocess.run([sys.executable, "-c", lint, "--config", str(REPO_ROOT / "pyproject.toml")],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(target)})
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 broken" in done.stdout, done.stdout
