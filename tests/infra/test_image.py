"""The container image from infra/image/build.sh, run from its own filesystem (infra/image/smoke.sh).

Building it downloads ~3 GB of wheels and takes ~30 min on 2 cores, so CI does not; where an image was
built on this machine (~/.cache/sie/image, or SIE_IMAGE_DIR), this runs the smoke test against the
session's broker: `sie --version` and an exactly-once scoring run, read-only root, user 10001."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from sie.kernel.settings import Settings
from tests.support.helpers import REPO_ROOT

pytestmark = pytest.mark.kafka

IMAGE = Path(os.environ.get("SIE_IMAGE_DIR", Path.home() / ".cache" / "sie" / "image"))


def test_the_image_scores_exactly_once_from_its_own_filesystem(kafka_settings: Settings):
    if not (IMAGE / "rootfs" / "usr" / "local" / "bin" / "sie").exists():
        pytest.skip(f"no image built at {IMAGE} (infra/image/build.sh; CI does not build it)")
    if os.geteuid() != 0 or shutil.which("chroot") is None:
        pytest.skip("the smoke test mounts and chroots: it needs root")
    env = {**os.environ, "SIE_BOOTSTRAP_SERVERS": kafka_settings.bootstrap_servers, "SMOKE_REQUESTS": "300"}
    out = subprocess.run(["bash", str(REPO_ROOT / "infra" / "image" / "smoke.sh"), str(IMAGE)], env=env,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "sie 0.1.0" in out.stdout
    assert "requests 300, results 300 for 300 ids, duplicates 0, missing 0, dead letters 0" in out.stdout
