"""A path or module name from a spec longer than the file system allows is a spec error naming the field
(issue 37, item 9): before, ``Path.is_file()`` raised ``OSError: [Errno 36] File name too long`` out of the
parser, and ``sie validate -f`` printed a traceback (found by tests/fuzz/test_fuzz_spec.py)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from sie.cli import main
from sie.kernel.errors import SpecError
from sie.kernel.names import NAME_MAX, PATH_MAX, path_problem
from sie.schemas.spec import load
from tests.fuzz.test_fuzz_spec import check_doc
from tests.support.helpers import REPO_ROOT

EXAMPLES = REPO_ROOT / "examples"
SEED = yaml.safe_load((EXAMPLES / "fraud-scorer.yaml").read_text())


def _with_backend(**backend: Any) -> dict[str, Any]:
    doc = copy.deepcopy(SEED)
    doc["spec"]["backend"].update(backend)
    return doc


LONG = "a" * (NAME_MAX + 1)


@pytest.mark.parametrize(("backend", "field"), [
    ({"artifact": LONG + ".pt"}, "spec.backend.artifact"),
    ({"artifact": "models/" + LONG + "/model.pt"}, "spec.backend.artifact"),
    ({"artifact": "/".join(["abcdefgh"] * (PATH_MAX // 9 + 1)) + ".pt"}, "spec.backend.artifact"),
    ({"artifact": "models/fraud/fraud_scorer.pt", "moduleClass": LONG + ".net:Net"}, "spec.backend.moduleClass"),
    ({"type": "python", "artifact": None, "callable": "pkg." + LONG + ":score"}, "spec.backend.callable"),
])
def test_a_too_long_name_is_a_spec_error_naming_the_field(backend: dict[str, Any], field: str):
    doc = _with_backend(**backend)
    with pytest.raises(SpecError) as refused:
        load(doc, origin="t", base_dir=EXAMPLES)
    assert field in str(refused.value) and "Errno" not in str(refused.value), str(refused.value)
    check_doc(_with_backend(**backend))  # the fuzz property: a SpecError whose every line names a field


def test_sie_validate_prints_the_field_not_a_traceback(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(_with_backend(artifact=LONG + ".pt")))
    code = main(["validate", "-f", str(spec)])
    out = capsys.readouterr()
    assert code != 0
    assert "spec.backend.artifact" in out.err and "Traceback" not in out.err + out.out, out.err


def test_the_limits_are_bytes_per_component_and_per_path():
    assert path_problem("a" * NAME_MAX) is None
    assert path_problem("é" * (NAME_MAX // 2 + 1)) is not None  # 2 bytes each in UTF-8
    assert path_problem("x/" * (PATH_MAX // 2)) is None
    assert path_problem("x/" * (PATH_MAX // 2 + 1)) is not None
    assert path_problem("a\0b") is not None
    assert path_problem("\udcff" * 3) is None  # a surrogate-escaped byte is one byte, like the file system sees it
