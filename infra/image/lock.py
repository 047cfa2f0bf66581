"""Write the image's lock files: every Python dependency of ``sie[k8s]`` pinned to one version with the
sha256 of the one binary wheel the image installs (``pip install --require-hashes`` verifies them).

    python3 infra/image/lock.py cpu     -> infra/image/requirements-cpu.lock   (Debian trixie, CPython 3.13)
    python3 infra/image/lock.py cuda    -> infra/image/requirements-cuda.lock  (Debian bookworm, CPython 3.11)

The two flavours (infra/image/build.sh):

- ``cpu``: torch is Debian's ``python3-torch`` (a CPU build, hash-checked by apt through the signed release
  file), so the lock holds everything else. PyPI's x86_64 torch is a CUDA build that does not import
  without its ``nvidia-*`` wheels (~4 GB), which is what made the first image 5.5 GB.
- ``cuda``: torch and its ``nvidia-*`` wheels from PyPI, pinned like the rest.

How: ``pip install --dry-run --report`` resolves ``sie[k8s]`` for the image's platform and Python, binary wheels
only (nothing is compiled), and reports each wheel's sha256 from the index without downloading it (pip >= 24
reads the wheels' metadata files; an older pip downloads ~4 GB for the cuda flavour). A
``name==version --hash=sha256:...`` line per wheel. Rerun it after a dependency changes in pyproject.toml;
tests/infra/test_image_lock.py fails while a lock misses a requirement or pins a version the requirement
refuses.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
# flavour -> (CPython of the image's Debian suite, its glibc, requirements the Debian rootfs provides instead)
FLAVOURS: dict[str, tuple[str, int, frozenset[str]]] = {
    "cpu": ("3.13", 41, frozenset({"torch"})),       # Debian trixie: glibc 2.41
    "cuda": ("3.11", 36, frozenset()),               # Debian bookworm: glibc 2.36
}


def platforms(flavour: str) -> list[str]:
    """Every manylinux tag the image's glibc runs (pip matches --platform tags exactly: a wheel tagged
    manylinux_2_34 is not taken for --platform manylinux_2_36 alone). infra/image/build.sh lists the same."""
    glibc = FLAVOURS[flavour][1]
    return [f"manylinux_2_{v}_x86_64" for v in range(glibc, 16, -1)] + ["manylinux2014_x86_64", "linux_x86_64"]


def requirements(flavour: str) -> list[Requirement]:
    """sie[k8s]'s direct requirements for ``flavour`` (those its Debian rootfs provides left out)."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    reqs = [Requirement(r) for r in project["dependencies"] + project["optional-dependencies"]["k8s"]]
    return [r for r in reqs if canonicalize_name(r.name) not in FLAVOURS[flavour][2]]


def lock_path(flavour: str) -> Path:
    return HERE / f"requirements-{flavour}.lock"


def main(flavour: str) -> None:
    pyver, _, from_debian = FLAVOURS[flavour]
    with tempfile.TemporaryDirectory() as tmp:
        reqs_in = Path(tmp) / "requirements.in"
        reqs_in.write_text("".join(f"{r}\n" for r in requirements(flavour)))
        platform_args = [a for p in platforms(flavour) for a in ("--platform", p)]
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--dry-run", "--ignore-installed",
                        "--report", f"{tmp}/report.json", "--only-binary=:all:", *platform_args,
                        "--python-version", pyver, "--implementation", "cp", "--target", f"{tmp}/target",
                        "-r", str(reqs_in)], check=True)
        report = json.loads(Path(tmp, "report.json").read_text())
    lines = []
    for item in sorted(report["install"], key=lambda i: canonicalize_name(i["metadata"]["name"])):
        name, version = canonicalize_name(item["metadata"]["name"]), item["metadata"]["version"]
        if name in from_debian:
            raise SystemExit(f"lock.py: {name} came in as a dependency, but the {flavour} image takes it "
                             "from Debian; pin what pulls it in")
        url, digest = item["download_info"]["url"], item["download_info"]["archive_info"]["hashes"]["sha256"]
        if not url.endswith(".whl"):
            raise SystemExit(f"lock.py: {name} {version} resolved to {url}, not a wheel")
        lines.append(f"{name}=={version} \\\n    --hash=sha256:{digest}\n")
    header = (f"# The {flavour} image's Python dependencies (sie[k8s] for CPython {pyver}, manylinux x86_64 wheels),\n"
              f"# each pinned with the sha256 of its wheel. Written by `python3 infra/image/lock.py {flavour}`;\n"
              "# infra/image/build.sh installs them with `pip install --require-hashes --no-deps`.\n")
    if from_debian:
        header += f"# From Debian, not here: {', '.join(sorted(from_debian))}.\n"
    lock_path(flavour).write_text(header + "".join(lines))
    print(f"{lock_path(flavour)}: {len(lines)} wheels")


if __name__ == "__main__":
    if len(sys.argv) != 2 or sys.argv[1] not in FLAVOURS:
        raise SystemExit(f"usage: lock.py {{{'|'.join(FLAVOURS)}}}")
    main(sys.argv[1])
