"""``leave_group`` on a real broker: a static member stopped while its JoinGroup is in flight.

The broker registers a static member (``group.instance.id``) when its JoinGroup arrives, but the client learns
its member id only from the answer, which comes once every member has joined again.  librdkafka leaves a group
on unsubscribe only when it knows its member id (``rd_kafka_cgrp_unsubscribe``: ``RD_KAFKA_CGRP_HAS_JOINED``) and
discards a JoinGroup answer that arrives after it (``rd_kafka_cgrp_handle_JoinGroup``: not in wait-join).  A
member stopped then used to be given partitions by that join and to hold them until its session timed out:
seen in the demo, where an agent stopped a worker that was still joining and its partitions waited 10 s.
"""

from __future__ import annotations

import threading
import time

import pytest
from confluent_kafka import Consumer

from sie.kernel.clients import eos_consumer_config
from sie.streams.eos.transaction import leave_group
from tests.support.helpers import create_topic, unique_group, unique_topic, wait_until
from tests.support.scorer_fixtures import group_assignment

pytestmark = pytest.mark.kafka

SESSION_MS = 15_000  # what a member the join answered and nobody heard from holds its partitions for
PARTITIONS = 4
SLOW_HEARTBEAT_MS = 2_000  # the member that stays learns of each rebalance this late: the join stays in flight


def test_a_static_member_stopped_while_its_join_is_in_flight_leaves_the_group(kafka_settings):
    topic = create_topic(kafka_settings, unique_topic("leave"), partitions=PARTITIONS)
    group = unique_group("leave")

    def member(instance: str, heartbeat_ms: int) -> Consumer:
        return Consumer(eos_consumer_config(kafka_settings, group, f"leave-{instance}", group_instance_id=instance,
                                            session_timeout_ms=SESSION_MS, heartbeat_interval_ms=heartbeat_ms))

    stays, stopped = member("stays", SLOW_HEARTBEAT_MS), member("stopped", 250)
    done = threading.Event()

    def serve() -> None:  # the member that stays polls all along, as a stage does
        while not done.is_set():
            stays.poll(0.05)

    stays.subscribe([topic])
    server = threading.Thread(target=serve, daemon=True)
    server.start()
    try:
        wait_until(lambda: group_assignment(kafka_settings, group).get("stays") == list(range(PARTITIONS)), 60, 0.1,
                   "the first member owns every partition")
        stopped.subscribe([topic])
        # poll until the broker has the new static member (its JoinGroup arrived) and its answer has not come
        wait_until(lambda: stopped.poll(0.02) is None and "stopped" in group_assignment(kafka_settings, group),
                   30, 0.0, "the broker registers the joining member")
        assert not stopped.memberid(), "the join was answered already: this test needs it in flight"

        started = time.monotonic()
        left = leave_group(stopped, subscribed=True)  # as a stage's planned stop calls it
        stopped.close()
        wait_until(lambda: group_assignment(kafka_settings, group) == {"stays": list(range(PARTITIONS))},
                   SESSION_MS / 1000 * 3, 0.1,
                   lambda: f"the first member alone with every partition: {group_assignment(kafka_settings, group)}")
        took = time.monotonic() - started
        print(f"stopped mid-join: the other member owns all {PARTITIONS} partitions again after {took:.2f}s")
        assert left, "leave_group reported no LeaveGroup sent"
        # a member that left is out at once: the rest is the other member's next heartbeat and its join
        assert took < SESSION_MS / 1000 * 0.6, f"{took:.2f}s: the stopped member was dropped by its session timeout (old behaviour: 11.9 s with a 10 s session)"
    finally:
        done.set()
        server.join(10)
        stays.close()
