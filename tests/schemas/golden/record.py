"""Record the ModelService every example document parses to (run once with the parser of the day; the
golden test then holds every later parser to it): ``python -m tests.schemas.golden.record``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from sie.schemas.spec import InvalidSpec, load

REPO_ROOT = Path(__file__).resolve().parents[3]
HERE = Path(__file__).resolve().parent
#: every YAML under examples/ (the article's two ModelService documents included; CdcConnector and the
#: control-plane config are not ModelServices and record the refusal instead), and documents in docs/ that
#: take every key of every section in both spellings
SOURCES = sorted(p for p in (REPO_ROOT / "examples").rglob("*.yaml")) + sorted((HERE / "docs").glob("*.yaml"))


def portable(doc: Any) -> Any:
    """Absolute paths under the repository written relative to it (a golden file holds on any checkout)."""
    if isinstance(doc, dict):
        return {k: portable(v) for k, v in doc.items()}
    if isinstance(doc, list):
        return [portable(v) for v in doc]
    if isinstance(doc, str) and doc.startswith(str(REPO_ROOT) + "/"):
        return "<repo>/" + doc[len(str(REPO_ROOT)) + 1:]
    return doc


def golden_of(path: Path) -> dict[str, Any]:
    try:
        specs = load(path, many=True)
    except InvalidSpec as exc:
        return {"invalid": [portable(p) for p in exc.problems]}
    return {"specs": [portable(s.model_dump(mode="json")) for s in specs]}


def golden_path(path: Path) -> Path:
    return HERE / (str(path.relative_to(REPO_ROOT)).replace("/", "__") + ".json")


def main() -> None:
    for path in SOURCES:
        golden_path(path).write_text(json.dumps(golden_of(path), indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
