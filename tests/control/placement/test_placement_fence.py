"""The fence inside placement (pyproject.toml's import-linter contract): a rule (eligibility), the words
(explain), the ledger and the choice of victims (preemption) never import the plan or its entry points."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.test_import_contracts import _import_tree, _lint


@pytest.mark.parametrize("module", ["eligibility", "explain"])
def test_a_rule_or_a_reason_that_imports_the_plan_breaks_the_contract(tmp_path: Path, module: str) -> None:
    tree = _import_tree(tmp_path / "tree")
    source = tree / "sie" / "control" / "placement" / f"{module}.py"
    source.write_text(source.read_text() + "\nfrom sie.control.placement.plan import Allocator  # noqa\n")
    done = _lint(tree, tmp_path)
    assert done.returncode != 0, done.stdout
    assert "never import the plan" in done.stdout and "BROKEN" in done.stdout, done.stdout
    assert f"sie.control.placement.{module} -> sie.control.placement.plan" in done.stdout, done.stdout
