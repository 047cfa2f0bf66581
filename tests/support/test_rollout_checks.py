"""``tests/support/rollout_checks.check_answers`` on hand-made outputs: each rule finds what it must, and only that."""

from __future__ import annotations

from dataclasses import dataclass

import orjson

from sie.streams.scorer.rollout import EPOCH_HEADER, weighted_table
from tests.support.rollout_checks import EpochInfo, check_answers

STABLE, CANARY = "1.0.0", "1.1.0"
EPOCHS = {-1: EpochInfo(0, "before"), 0: EpochInfo(0, "Surging"), 1: EpochInfo(1000, "Canary"),
          2: EpochInfo(5000, "Canary"), 3: EpochInfo(0, "RolledBack")}


@dataclass
class Msg:
    """The parts of a confluent_kafka Message the check reads."""

    _key: bytes
    _value: bytes
    _headers: list[tuple[str, bytes]]
    _offset: int = 0

    def key(self) -> bytes:
        return self._key

    def value(self) -> bytes:
        return self._value

    def headers(self) -> list[tuple[str, bytes]]:
        return self._headers

    def partition(self) -> int:
        return 0

    def offset(self) -> int:
        return self._offset


def result(n: int, key: str, epoch: int, version: str | None = None, built: str | None = None,
           extra: list[tuple[str, bytes]] | None = None) -> Msg:
    rid = f"t-{n}"
    want = weighted_table((STABLE, None), (CANARY, None), EPOCHS[epoch].weight_bp).route(key.encode(), rid).version
    version = version or want
    doc = {"id": rid, "version": version, "outputs": {"built": built or version}}
    return Msg(key.encode(), orjson.dumps(doc), [(EPOCH_HEADER, str(epoch).encode()), *(extra or [])], n)


def canary_key(epoch: int) -> str:
    """A key whose bucket is the canary's at ``epoch``'s weight (request id t-0)."""
    for i in range(10_000):
        key = f"k{i}"
        table = weighted_table((STABLE, None), (CANARY, None), EPOCHS[epoch].weight_bp)
        if table.route(key.encode(), "t-0").version == CANARY:
            return key
    raise AssertionError("no canary key")


def test_answers_by_their_bucket_are_clean_and_a_rollback_may_send_a_key_back():
    key = canary_key(1)
    outputs = [result(0, key, 0), result(1, key, 1), result(2, key, 2), result(3, key, 3)]
    report = check_answers(outputs, [], EPOCHS, STABLE, CANARY)
    assert report.clean, report.findings()
    assert [v.split()[-1] for v in report.by_epoch] == [STABLE, CANARY, CANARY, STABLE]


def test_off_weight_fallback_wrong_code_early_canary_and_flip_back_are_each_found():
    key = canary_key(1)
    report = check_answers([result(0, key, 0, version=CANARY)], [], EPOCHS, STABLE, CANARY)
    assert len(report.off_weight) == 1 and len(report.canary_before_step) == 1, report.findings()
    report = check_answers([result(0, key, 1, extra=[("sie.routing.fallback", b"x")])], [], EPOCHS, STABLE, CANARY)
    assert len(report.off_weight) == 1 and "fallback" in report.off_weight[0]
    report = check_answers([result(0, key, 1, built=STABLE)], [], EPOCHS, STABLE, CANARY)
    assert report.off_weight == [f"t-0 (key {key}, partition 0, offset 0) labelled {CANARY}, answered by code {STABLE}"]
    # the canary answered the key at 10 %, then stable at 50 % (its bucket says canary: off-weight and a flip-back)
    report = check_answers([result(0, key, 1), result(1, key, 2, version=STABLE)], [], EPOCHS, STABLE, CANARY)
    assert len(report.flip_back) == 1 and len(report.off_weight) == 1, report.findings()
    # back to stable at a weight-0 epoch that is not a rollback (a stale epoch): a flip-back
    report = check_answers([result(0, key, 1), result(1, key, 0)], [], EPOCHS, STABLE, CANARY)
    assert len(report.flip_back) == 1 and report.off_weight == [], report.findings()
    # an epoch no rollout record has
    report = check_answers([Msg(b"k", orjson.dumps({"id": "t-0", "version": STABLE, "outputs": {}}),
                                [(EPOCH_HEADER, b"9")])], [], EPOCHS, STABLE, CANARY)
    assert len(report.off_weight) == 1 and "no rollout record" in report.off_weight[0]


def test_dead_letters_are_checked_by_their_version_header():
    key = canary_key(1)
    dead = Msg(key.encode(), orjson.dumps({"id": "t-0"}), [(EPOCH_HEADER, b"0"), ("sie.version", CANARY.encode())])
    report = check_answers([], [dead], EPOCHS, STABLE, CANARY)
    assert report.dead_letters == 1 and len(report.canary_before_step) == 1 and len(report.off_weight) == 1
