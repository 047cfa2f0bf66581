"""`sie demo` runs its `sie` commands in its work folder (``<cache_dir>/demo``) and its processes in their log
folder, where a relative ``examples/...`` does not exist (the CDC step once failed with "File
'examples/cdc/orders-to-fraud.yaml' does not exist").  Every shipped file it names goes through
``sie.demo.example``, which must point at a file that is there."""

from __future__ import annotations

import ast
from pathlib import Path

from sie import demo
from tests.support.helpers import REPO_ROOT

SOURCE = REPO_ROOT / "sie" / "demo.py"


def _string_literals() -> list[tuple[int, str, bool]]:
    """(line, value, is the argument of example(...)) of every string literal in sie/demo.py."""
    tree = ast.parse(SOURCE.read_text(encoding="utf-8"))
    wrapped = {id(call.args[0]) for call in ast.walk(tree)
               if isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == "example"
               and call.args}
    return [(node.lineno, node.value, id(node) in wrapped) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str)]


def test_every_example_the_demo_names_is_an_absolute_path_to_a_shipped_file() -> None:
    named = [(line, value) for line, value, wrapped in _string_literals() if wrapped]
    assert len(named) >= 3, named  # the CDC connector and its events, the model spec for the stage and backfill
    for line, value in named:
        path = Path(demo.example(value))
        assert path.is_absolute() and path.is_file(), f"sie/demo.py:{line}: {value} -> {path} is not a file"


def test_no_bare_relative_examples_path_reaches_a_command() -> None:
    bare = [(line, value) for line, value, wrapped in _string_literals()
            if value.startswith("examples/") and not wrapped]
    assert not bare, f"relative to the demo's work folder these do not exist; wrap them in example(): {bare}"
