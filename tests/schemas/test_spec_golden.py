"""Every example document (the article's two ModelServices included) parses to the ModelService recorded in
tests/schemas/golden/ by the parser of the day it was written (``python -m tests.schemas.golden.record``): a
rewrite of the spec reader must not change what any example means.  Documents that are no ModelService keep
being refused for the same fields."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.schemas.golden.record import SOURCES, golden_of, golden_path

REPO_ROOT = Path(__file__).resolve().parents[2]


def _fields(problems: list[str]) -> list[str]:
    return sorted(p.partition(":")[0] for p in problems)


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(REPO_ROOT)))
def test_example_parses_to_the_recorded_spec(path: Path) -> None:
    want = json.loads(golden_path(path).read_text())
    got = golden_of(path)
    if "specs" in want:
        assert got == want
    else:
        assert "invalid" in got, f"{path} was refused before and parses now"
        assert _fields(got["invalid"]) == _fields(want["invalid"])


def test_the_article_documents_are_covered() -> None:
    names = {p.relative_to(REPO_ROOT).as_posix() for p in SOURCES}
    assert {"examples/article/model-spec.yaml", "examples/article/qwen2-7b-scoring.yaml"} <= names
    for name in ("model-spec.yaml", "qwen2-7b-scoring.yaml"):
        assert "specs" in json.loads(golden_path(REPO_ROOT / "examples" / "article" / name).read_text())
