"""Previews and depth checks of outside data: bounded, never recursive, never raising."""

from __future__ import annotations

import orjson
import pytest

from sie.kernel.untrusted import depth_exceeds, exception_text, json_text_depth_exceeds, preview


def _nested(depth: int) -> list:
    node: list = []
    for _ in range(depth - 1):
        node = [node]
    return node


@pytest.mark.parametrize("value, text", [
    (None, "None"), (True, "True"), (1.5, "1.5"), (-42, "-42"), ("abc", "'abc'"),
    ("x" * 100, "'" + "x" * 60 + "'..."), (b"\x00ab", "b'\\x00ab'"),
    (10**400, "<integer of ~401 digits>"), (-(10**400), "-<integer of ~401 digits>"),
    ({"a": 1}, "an object of 1 key"), ([1, 2], "an array of 2 items"), ((), "an array of 0 items"),
    (object(), "a object"),
])
def test_preview_is_short_and_describes_what_it_does_not_print(value, text):
    assert preview(value) == text


def test_preview_of_hostile_values_neither_recurses_nor_grows():
    assert preview(_nested(100_000)) == "an array of 1 item"  # repr() would raise RecursionError
    assert len(preview("y" * 10_000_000)) < 70
    assert preview(10**10_000).endswith("digits>")  # str() refuses more than 4,300 digits


def test_depth_exceeds_is_iterative_and_exact_at_the_limit():
    assert depth_exceeds(_nested(64), 64) == 0
    assert depth_exceeds(_nested(65), 64) == 65
    assert depth_exceeds(_nested(100_000), 64) == 65  # stops at the first container past the limit
    assert depth_exceeds({"a": [{"b": _nested(2)}]}, 5) == 0
    assert depth_exceeds({"a": [{"b": _nested(3)}]}, 5) == 6
    assert depth_exceeds("scalar", 0) == 0


def test_json_text_pre_check_agrees_with_the_exact_check():
    for text in (b'{"a": "[[[[[[[[[[[["}', b"[[[[[]]]]]", b'{"a":{"b":{"c":{}}}}', b"1"):
        doc = orjson.loads(text)
        assert json_text_depth_exceeds(text, doc, 3) == depth_exceeds(doc, 3)
        assert json_text_depth_exceeds(text.decode(), doc, 3) == depth_exceeds(doc, 3)


def test_exception_text_is_bounded_and_survives_a_broken_str():
    class Broken(Exception):
        def __str__(self) -> str:
            raise RuntimeError("no")

    assert exception_text(ValueError("x" * 1000), 50) == "ValueError: " + "x" * 47 + "..."
    assert exception_text(ValueError("bad"), with_type=False) == "bad"
    assert exception_text(Broken()) == "Broken"
    assert exception_text(KeyError(), with_type=False) == "KeyError"
