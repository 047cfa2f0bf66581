"""The fault campaign on the 3-broker cluster (issue 9), driver in tests/support/fault_campaign.py.

CI runs a bounded profile: (a) SIGKILL + restart of the broker leading a request partition, (d) SIGSTOP of a
broker longer than the scorer's session timeout, (e) the leading control plane SIGSTOPped past its session
then resumed; one trial each at a small load.  The rest of the campaign, (b) the transaction coordinator's
broker, (c) the ``__consumer_offsets`` leader's broker, (f) an agent SIGSTOPped past the node timeout, runs
with ``SIE_FAULT_CAMPAIGN=full`` (marker ``fault_campaign``); bench/bench_faults.py runs all of it and
writes the table (bench/results/faults.txt).

Each trial: nothing lost, nothing doubled (every request delivered so far has exactly one committed result
or dead letter per record of it in the request topic, read_committed), the scorer process never exited, every request partition stalled less
than the fault's bound (``BROKER_BOUND_S`` for a broker fault, ``STALL_BOUND_S`` for the others); the
fixture's teardown proves the whole run once more with a fresh reader.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from sie.infra.kafka.local import LocalKafka
from tests.support.fault_campaign import ControlRig, FaultResult, ScorerRig

FULL = os.environ.get("SIE_FAULT_CAMPAIGN", "") == "full"


def _held(result: FaultResult) -> None:
    print(result.row())  # the measured row, for -s runs
    assert result.lost == 0 and result.doubled == 0, result
    assert result.stall_s < result.bound_s and result.recovery_s < result.bound_s, result


@pytest.fixture(scope="module")
def scorer(kafka_cluster3: LocalKafka, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ScorerRig]:
    rig = ScorerRig(kafka_cluster3, tmp_path_factory.mktemp("fault-scorer"), rate_per_s=40 if FULL else 20)
    ok = False
    try:
        yield rig
        ok = True
    finally:
        if ok:
            requests, lost, doubled = rig.close()
            assert (lost, doubled) == (0, 0), (f"{requests} requests: {lost} lost, {doubled} doubled; "
                                               f"{rig.observer.account_note}")
        else:
            rig.observer.close()
            rig.scorer.ensure_dead()


@pytest.fixture(scope="module")
def control(kafka_cluster3: LocalKafka, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlRig]:
    rig = ControlRig(kafka_cluster3, tmp_path_factory.mktemp("fault-control"), rate_per_s=20)
    try:
        yield rig
    finally:
        requests, lost, doubled = rig.close()
        assert (lost, doubled) == (0, 0), (f"{requests} requests: {lost} lost, {doubled} doubled; "
                                           f"{rig.observer.account_note}")


def test_a_kill_of_the_request_partition_leader(scorer: ScorerRig) -> None:
    _held(scorer.kill_and_restart("(a) SIGKILL + restart: leader of a request partition", scorer.request_leader()))


def test_d_broker_paused_past_the_scorer_session(scorer: ScorerRig) -> None:
    _held(scorer.pause_and_resume("(d) SIGSTOP > session timeout, SIGCONT: leader of a request partition",
                                  scorer.request_leader()))


@pytest.mark.parametrize("target", ["txn_coordinator", "offsets_leader"])
@pytest.mark.fault_campaign
@pytest.mark.skipif(not FULL, reason="full fault campaign: SIE_FAULT_CAMPAIGN=full (CI runs a/d/e)")
def test_b_c_kill_of_a_coordinator(scorer: ScorerRig, target: str) -> None:
    name = {"txn_coordinator": "(b) SIGKILL + restart: transaction coordinator",
            "offsets_leader": "(c) SIGKILL + restart: __consumer_offsets leader"}[target]
    _held(scorer.kill_and_restart(name, getattr(scorer, target)()))


def test_e_control_plane_leader_paused_past_its_session_never_acts_after_resuming(control: ControlRig) -> None:
    _held(control.leader_pause())


@pytest.mark.fault_campaign
@pytest.mark.skipif(not FULL, reason="full fault campaign: SIE_FAULT_CAMPAIGN=full (CI runs a/d/e)")
def test_f_agent_paused_past_the_node_timeout(control: ControlRig) -> None:
    _held(control.agent_pause())
