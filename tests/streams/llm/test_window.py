"""The window's commit rule: only each partition's contiguous finished prefix leaves it."""

from __future__ import annotations

from sie.streams.llm.window import Window
from tests.fakes.kafka_clients import FakeMessage


def msgs(partition: int, offsets: range) -> list[FakeMessage]:
    return [FakeMessage("req", partition, o, b"k", b"{}") for o in offsets]


def test_only_the_contiguous_finished_prefix_is_ready():
    w = Window()
    for m in msgs(0, range(10, 15)) + msgs(1, range(0, 3)):
        w.add(m)
    assert w.size == 8
    # out of order: 12 and 11 finish, 10 (the head) has not
    assert w.finish(("req", 0), 12, 0, ["r12"]) and w.finish(("req", 0), 11, 0, ["r11"])
    assert w.ready() == 0 and w.take_ready() == []
    assert w.finish(("req", 0), 10, 0, ["r10"])
    w.finish(("req", 1), 1, 0, ["p1-1"])  # partition 1: offset 0 unfinished, nothing of it ready
    taken = w.take_ready()
    assert [(e.msg.partition(), e.msg.offset()) for e in taken] == [(0, 10), (0, 11), (0, 12)]
    assert w.size == 5 and w.first_offsets() == {("req", 0): 13, ("req", 1): 0}
    # finishing twice is refused (one answer per record)
    assert not w.finish(("req", 1), 1, 0, ["again"])


def test_a_dropped_partition_ignores_late_generations_and_new_records_get_a_new_epoch():
    w = Window()
    for m in msgs(0, range(3)):
        w.add(m)
    assert w.drop([("req", 0)]) == 3 and w.size == 0
    assert not w.finish(("req", 0), 1, 0, ["late"])  # epoch 0 is gone
    entry = w.add(FakeMessage("req", 0, 0, b"k", b"{}"))  # read again after the rewind
    assert entry.epoch == 1
    assert w.get(("req", 0), 0, 0) is None and w.get(("req", 0), 0, 1) is entry
    assert w.finish(("req", 0), 0, 1, ["fresh"]) and [e.outputs for e in w.take_ready()] == [["fresh"]]


def test_reset_forgets_everything_and_counts_stay_consistent():
    w = Window()
    for m in msgs(0, range(4)) + msgs(2, range(2)):
        w.add(m)
    w.finish(("req", 0), 0, 0, ["a"])
    w.finish(("req", 2), 1, 0, ["b"])
    assert w.finished == 2
    assert w.reset() == 6
    assert (w.size, w.finished, w.ready()) == (0, 0, 0)
    assert w.epoch(("req", 0)) == 1 and w.epoch(("req", 2)) == 1
