"""The transaction coordinator moves during a commit (issue 35), on 3 real brokers behind the fault proxy.

The stage's EndTxn reaches its coordinator (which writes PrepareCommit to ``__transaction_state``, replicated),
its answer is dropped, and the coordinator's broker is SIGKILLed: another broker takes the
``__transaction_state`` partition over and finishes the commit from its log.  Either the commit's retry
reaches the new coordinator, which answers it (the transaction is complete: the outcome is known after all),
or the commit gives up: an unknown outcome, and the one rule (no abort; a new producer finds the new
coordinator, whose ``init_transactions`` answers once the transaction is complete; the positions come from the
committed offsets).  Seen here: the retry answered (the producer was not re-created).
Model topics have replication factor 3 and ``min.insync.replicas`` 2, so writes go on with two brokers.
Exactly once over the read_committed results: 0 lost, 0 duplicated.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.streams.eos.test_unknown_outcome_kafka import Requests, Stage, topics
from tests.support.fault_campaign import txn_coordinator
from tests.support.helpers import wait_until
from tests.support.kafka_proxy import END_TXN, ProxiedCluster, proxied_cluster

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(900)]


@pytest.fixture()
def cluster3(base_settings: Any, tmp_path: Path) -> Iterator[ProxiedCluster]:
    with proxied_cluster(base_settings, tmp_path / "kafka", brokers=3) as proxied:
        yield proxied


def test_the_coordinator_moving_during_a_commit_is_answered_exactly_once(cluster3):
    requests, results = topics(cluster3, replication=3)
    load = Requests(cluster3, requests)
    stage = Stage(cluster3, requests, results)
    settings = cluster3.direct_settings()
    killed = None
    try:
        load.send(40)
        load.wait_answered(results, 90, "before the fault")
        _p, coordinator = txn_coordinator(settings, stage.transactional_id)
        proxy = cluster3.proxies[coordinator]
        proxy.drop(END_TXN)
        load.send(10)  # the batch whose commit meets the fault
        wait_until(lambda: proxy.dropped[END_TXN] >= 1, 60, message="the EndTxn answer dropped at the coordinator")
        cluster3.kafka.kill_broker(coordinator)
        killed = coordinator
        wait_until(lambda: txn_coordinator(settings, stage.transactional_id)[1] not in (coordinator, -1), 60,
                   interval=0.5, message="another broker taking the transaction coordinator over")
        load.send(40)
        load.wait_answered(results, 120, "with the coordinator moved")
    finally:
        if killed is not None:
            cluster3.kafka.start_broker(killed, timeout=120)
        stage.close()
    load.prove(results)
    # the commit's own retry may reach the new coordinator, which answers it (the transaction is complete): then
    # nothing was unknown; else the one rule re-created the producer.  Either way nothing was aborted.
    assert stage.eos.aborts == 0, stage.outcomes
    print(f"commit outcomes {dict(stage.outcomes)}; producers created {stage.producers}")
