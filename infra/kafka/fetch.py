"""Resolve the Apache Kafka broker jars from Maven Central, once per machine.

Why Maven and not a tarball: Maven Central is the one Java registry every SIE
machine (developer, CI) can reach.  ``infra/kafka/pom.xml`` lists only the broker
and the SLF4J->Log4j2 bridge, so Maven never mixes its scala/jackson versions
with anything else.  The jars land in ``<kafka_cache_dir>/<version>/lib``; once a
``.complete`` marker is there, Maven is not run again (works offline).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

from sie.kernel.errors import ConfigError
from sie.kernel.settings import Settings

# Shipped as package data of sie.infra.kafka, so an installed SIE needs no source checkout.
POM = Path(__file__).resolve().parent / "pom.xml"
LOG4J_CONFIG = Path(__file__).resolve().parent / "log4j2.properties"
INSTALL_HINT = "install it: apt-get install openjdk-17-jre-headless maven"
_MARKER = ".complete"

Echo = Callable[[str], None]


def require_tool(name: str, path: str | None = None) -> str:
    """Absolute path of an executable on PATH, or a ConfigError naming it and the fix."""
    found = shutil.which(name, path=path)
    if found is None:
        raise ConfigError(f"`{name}` not found on PATH (needed to run a local Kafka broker): {INSTALL_HINT}")
    return found


def log4j_version(kafka_version: str) -> str:
    """The Log4j2 version the Kafka release tarball ships (the bridge must match log4j-core)."""
    major_minor = tuple(int(p) for p in kafka_version.split(".")[:2])
    return "2.24.3" if major_minor < (4, 2) else "2.25.3"


def lib_dir(settings: Settings) -> Path:
    return settings.kafka_cache_dir / settings.kafka_version / "lib"


def jars_present(settings: Settings) -> bool:
    lib = lib_dir(settings)
    return (lib / _MARKER).is_file() and (lib / f"kafka_2.13-{settings.kafka_version}.jar").is_file()


def ensure_jars(settings: Settings, echo: Echo = print, path: str | None = None) -> Path:
    """Return the lib dir holding the broker jars; run Maven only if they are missing.

    Maven copies into a private temp dir that is renamed into place, so two
    concurrent fetches never leave a half-filled lib dir behind.
    """
    lib = lib_dir(settings)
    if jars_present(settings):
        return lib
    require_tool("java", path)
    mvn = require_tool("mvn", path)
    lib.parent.mkdir(parents=True, exist_ok=True)
    staging = lib.parent / f"lib.tmp-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    echo(f"fetching Apache Kafka {settings.kafka_version} from Maven Central into {lib} (once per machine) ...")
    cmd = [
        mvn, "-q", "-B", "-f", str(POM),
        f"-Dkafka.version={settings.kafka_version}",
        f"-Dlog4j.version={log4j_version(settings.kafka_version)}",
        "dependency:copy-dependencies",
        "-DincludeScope=runtime",
        f"-DoutputDirectory={staging}",
    ]
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        shutil.rmtree(staging, ignore_errors=True)
        tail = "\n".join((result.stdout + result.stderr).strip().splitlines()[-15:])
        raise ConfigError(
            f"Maven could not resolve org.apache.kafka:kafka_2.13:{settings.kafka_version} "
            f"(check network access to Maven Central or set SIE_KAFKA_VERSION): {tail}"
        )
    (staging / _MARKER).write_text(settings.kafka_version + "\n")
    if lib.exists() and not jars_present(settings):  # a copy interrupted before the marker
        shutil.rmtree(lib, ignore_errors=True)
    try:
        staging.rename(lib)
    except OSError:  # another process finished first; its copy is as good as ours
        shutil.rmtree(staging, ignore_errors=True)
        if not jars_present(settings):
            raise
    echo(f"fetched {sum(1 for _ in lib.glob('*.jar'))} jars into {lib}")
    return lib
