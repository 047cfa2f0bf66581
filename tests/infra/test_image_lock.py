"""The image's lock files (infra/image/requirements-<flavour>.lock, written by infra/image/lock.py): every
requirement of ``sie[k8s]`` is pinned there, at a version the requirement admits, with a sha256, so
infra/image/build.sh's ``pip install --require-hashes`` installs exactly what was locked. A dependency added to
pyproject.toml without relocking fails here, not in an image build."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
from packaging.utils import canonicalize_name
from packaging.version import Version

from tests.support.helpers import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "infra" / "image"))
import lock  # noqa: E402  (infra/image/lock.py: the requirements each flavour locks)

ENTRY = re.compile(r"^(?P<name>[A-Za-z0-9._-]+)==(?P<version>\S+) \\\n    --hash=sha256:(?P<sha>[0-9a-f]{64})$", re.M)


def parse(path: Path) -> dict[str, Version]:
    text = path.read_text()
    body = "\n".join(line for line in text.splitlines() if not line.startswith("#"))
    entries = list(ENTRY.finditer(text))
    # nothing in the file but comments and complete `name==version --hash` entries
    assert ENTRY.sub("", body).strip() == "", f"{path.name}: a line that is not `name==version --hash=sha256:...`"
    pins = {canonicalize_name(m["name"]): Version(m["version"]) for m in entries}
    assert len(pins) == len(entries), f"{path.name}: a package pinned twice"
    return pins


@pytest.mark.parametrize("flavour", sorted(lock.FLAVOURS))
def test_every_requirement_is_pinned_with_a_hash_at_an_admitted_version(flavour: str):
    path = lock.lock_path(flavour)
    if not path.exists():
        pytest.skip(f"{path.name} not written (python3 infra/image/lock.py {flavour} downloads its wheels)")
    pins = parse(path)
    for req in lock.requirements(flavour):
        name = canonicalize_name(req.name)
        assert name in pins, f"{path.name} misses {req}: rerun python3 infra/image/lock.py {flavour}"
        assert req.specifier.contains(pins[name], prereleases=True), (
            f"{path.name} pins {name}=={pins[name]}, which {req} refuses: rerun python3 infra/image/lock.py {flavour}")
    for name in lock.FLAVOURS[flavour][2]:
        assert name not in pins, f"{path.name} pins {name}, which the {flavour} image takes from Debian"


def test_the_cpu_lock_exists_and_leaves_torch_to_debian():
    pins = parse(lock.lock_path("cpu"))
    assert "torch" not in pins and not any(n.startswith("nvidia-") and n != "nvidia-ml-py" for n in pins)
    assert {"confluent-kafka", "kubernetes", "numpy", "pydantic"} <= set(pins)
