"""sie.streams.eos.lag.consumer_lag against a fake consumer (the arithmetic and the 'unknown' cases)."""

from __future__ import annotations

from confluent_kafka import OFFSET_INVALID, KafkaError, KafkaException, TopicPartition

from sie.streams.eos.lag import consumer_lag


class FakeConsumer:
    def __init__(self, positions: dict[int, int], highs: dict[int, int], fail: bool = False) -> None:
        self._positions, self._highs, self._fail = positions, highs, fail

    def assignment(self) -> list[TopicPartition]:
        return [TopicPartition("t", p) for p in self._positions]

    def position(self, tps: list[TopicPartition]) -> list[TopicPartition]:
        if self._fail:
            raise KafkaException(KafkaError(KafkaError._STATE))
        return [TopicPartition("t", tp.partition, self._positions[tp.partition]) for tp in tps]

    def get_watermark_offsets(self, tp: TopicPartition, cached: bool = False) -> tuple[int, int]:
        assert cached, "the lag refresh must not wait on the broker"
        return 0, self._highs[tp.partition]


def test_lag_is_high_watermark_minus_position_and_skips_unknown_partitions():
    consumer = FakeConsumer({0: 10, 1: 50, 2: OFFSET_INVALID, 3: 7}, {0: 25, 1: 40, 2: 9, 3: -1})
    assert consumer_lag(consumer) == {0: 15, 1: 0}


def test_no_assignment_or_a_client_error_gives_no_lag():
    assert consumer_lag(FakeConsumer({}, {})) == {}
    assert consumer_lag(FakeConsumer({0: 1}, {0: 5}, fail=True)) == {}
