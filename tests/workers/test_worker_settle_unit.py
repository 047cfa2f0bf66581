"""A planned stop of a serving worker waits (serving on) until its consumer group has settled, at most
``SETTLE_LIMIT_S``: a leave on top of a join's unfinished cooperative rebalance made the partitions that join
had revoked wait for both rebalances (2.1-2.4 s per partition at the surge replica's stop, docs/rollouts.md)."""

from __future__ import annotations

import threading
from types import SimpleNamespace

from confluent_kafka import ConsumerGroupState

from sie.kernel.settings import Settings
from sie.workers.worker_main import wait_group_settled


class _Future:
    def __init__(self, value) -> None:
        self.value = value

    def result(self, timeout=None):
        if isinstance(self.value, Exception):
            raise self.value
        return self.value


def _group(state, *owned):
    tps = [SimpleNamespace(topic="req", partition=p) for p in owned]
    return SimpleNamespace(state=state, members=[SimpleNamespace(assignment=SimpleNamespace(topic_partitions=tps))])


class _Admin:
    def __init__(self, answers) -> None:
        self.answers = list(answers)
        self.asked = 0

    def describe_consumer_groups(self, groups, request_timeout=None):
        self.asked += 1
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        return {groups[0]: _Future(answer)}

    def list_topics(self, topic, timeout=None):
        return SimpleNamespace(topics={topic: SimpleNamespace(partitions={0: None, 1: None, 2: None})})


def _clients(admin):
    return SimpleNamespace(admin=lambda _config: admin)


def test_a_planned_stop_waits_for_a_stable_group_with_every_partition_owned():
    admin = _Admin([RuntimeError("coordinator loading"), _group(ConsumerGroupState.PREPARING_REBALANCING, 0, 1),
                    _group(ConsumerGroupState.STABLE, 0, 1),  # round 1 of a cooperative join: 2 is nobody's
                    _group(ConsumerGroupState.STABLE, 0, 1, 2)])
    assert wait_group_settled(Settings(), "g", "req", threading.Event(), limit_s=30, clients=_clients(admin))
    assert admin.asked == 4


def test_a_group_that_does_not_settle_delays_the_stop_at_most_the_limit():
    admin = _Admin([_group(ConsumerGroupState.COMPLETING_REBALANCING, 0)])
    assert not wait_group_settled(Settings(), "g", "req", threading.Event(), limit_s=0.3, clients=_clients(admin))
    assert 1 <= admin.asked <= 5
