"""``sie describe model``'s Events lines (``sie.commands.cluster.event_lines``): the quick start showed two
identical "unschedulable" lines at the same second, one per replica, reading like one event said twice."""

from __future__ import annotations

from sie.commands.cluster import event_lines


def _row(replica: str | None, detail: str, count: int = 1) -> dict:
    return {"ts_ms": 1_000_000, "first_ts_ms": 990_000, "kind": "unschedulable", "model": "m", "replica_id": replica,
            "node": None, "detail": detail, "count": count}


def test_each_line_names_its_replica_unless_the_detail_does():
    reason = "unschedulable: no online node matches nodeSelector gpu=A100"
    lines = event_lines([_row("m-0", reason), _row("m-1", reason), _row("m-1", "placed m-1 on node-a"),
                         _row(None, "model applied")])
    assert [line.split("unschedulable ", 1)[1].strip() for line in lines] == [
        f"m-0: {reason}", f"m-1: {reason}", "placed m-1 on node-a", "model applied"]


def test_a_repeated_event_says_how_often_and_none_says_so():
    (line,) = event_lines([_row("m-0", "x", count=3)])
    assert "m-0: x (x3, first at " in line
    assert event_lines([]) == ["  (none recent)"]
