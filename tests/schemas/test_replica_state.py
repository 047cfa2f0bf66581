"""The replica state contract: the enum against the Avro enum, the transition table, and the wire identity."""

from __future__ import annotations

import itertools
import json

import pytest

from sie.kernel.errors import SieError
from sie.schemas import avro_codec
from sie.schemas.replica_state import (
    AGENT_STATES,
    CONTROL_PLANE_STATES,
    TRANSITIONS,
    WIRE_STATES,
    ReplicaState,
    ReplicaTransitionError,
    allowed_next,
    check_transition,
    parse_state,
)

S = ReplicaState
ALLOWED = sorted((old, new) for old, nexts in TRANSITIONS.items() for new in nexts)
DISALLOWED = sorted(set(itertools.product(ReplicaState, ReplicaState)) - set(ALLOWED))


# ------------------------------------------------------------------------------------ the Avro enum


def test_enum_lists_the_avro_symbols_in_order_plus_the_control_plane_only_state() -> None:
    avsc = json.loads((avro_codec.AVRO_DIR / "ReplicaState.avsc").read_text())
    assert [s.value for s in ReplicaState if s in WIRE_STATES] == avsc["symbols"]
    assert avsc["default"] == S.UNKNOWN
    assert set(ReplicaState) - WIRE_STATES == {S.UNSCHEDULABLE}


def test_records_carry_the_same_enum() -> None:
    """ReplicaStatus and the Heartbeat's ReplicaReport inline the shared enum: same symbols."""
    status = avro_codec.schema("ReplicaStatus")
    (state_field,) = [f for f in status["fields"] if f["name"] == "state"]
    assert state_field["type"]["symbols"] == [s.value for s in ReplicaState if s in WIRE_STATES]


def test_state_groups() -> None:
    assert AGENT_STATES == WIRE_STATES - {S.UNKNOWN}
    assert CONTROL_PLANE_STATES == {S.UNKNOWN, S.UNSCHEDULABLE}
    assert not AGENT_STATES & CONTROL_PLANE_STATES
    assert {s for s in ReplicaState if s.has_process} == {S.STARTING, S.READY, S.DRAINING}


def test_the_workers_use_the_one_enum() -> None:
    from sie.workers import replica

    assert replica.ReplicaState is ReplicaState


# ------------------------------------------------------------------------------------ the table


def test_table_covers_exactly_the_agent_states() -> None:
    assert set(TRANSITIONS) == AGENT_STATES
    for old, nexts in TRANSITIONS.items():
        assert nexts <= AGENT_STATES, f"{old} leads to a state an agent never reports: {nexts - AGENT_STATES}"


def _reachable(start: ReplicaState) -> set[ReplicaState]:
    seen, todo = {start}, [start]
    while todo:
        for nxt in allowed_next(todo.pop()):
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def test_every_agent_state_is_reachable_from_pending_and_can_reach_stopped() -> None:
    assert _reachable(S.PENDING) == AGENT_STATES
    for state in AGENT_STATES:
        assert S.STOPPED in _reachable(state), f"{state} can never be stopped"


def test_stopped_is_the_only_terminal_state_and_crashed_the_only_self_transition() -> None:
    assert [s for s in AGENT_STATES if not TRANSITIONS[s]] == [S.STOPPED]
    assert [s for s in ReplicaState if s in allowed_next(s)] == [S.CRASHED]


@pytest.mark.parametrize(("old", "new"), ALLOWED, ids=[f"{o}->{n}" for o, n in ALLOWED])
def test_allowed_transition_passes(old: ReplicaState, new: ReplicaState) -> None:
    assert check_transition(old, new, "fraud-scorer-0") is None


@pytest.mark.parametrize(("old", "new"), DISALLOWED, ids=[f"{o}->{n}" for o, n in DISALLOWED])
def test_every_other_transition_raises_naming_both_states(old: ReplicaState, new: ReplicaState) -> None:
    with pytest.raises(ReplicaTransitionError) as info:
        check_transition(old, new)
    assert f"transition {old.value} -> {new.value} is not allowed; from {old.value} the allowed next states are: " in str(info.value)


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        (S.FAILED, S.READY, "replica fraud-scorer-0: transition FAILED -> READY is not allowed; "
                            "from FAILED the allowed next states are: STOPPED."),
        (S.READY, S.STARTING, "transition READY -> STARTING is not allowed; "
                              "from READY the allowed next states are: DRAINING, FAILED, CRASHED."),
        (S.DRAINING, S.CRASHED, "from DRAINING the allowed next states are: STOPPED."),
        (S.STOPPED, S.STARTING, "from STOPPED the allowed next states are: none (STOPPED is terminal)."),
        (S.READY, S.READY, "transition READY -> READY is not allowed"),
        (S.PENDING, S.UNSCHEDULABLE, "transition PENDING -> UNSCHEDULABLE is not allowed"),
        (S.UNKNOWN, S.READY, "none (UNKNOWN is never an agent-side state)."),
    ],
)
def test_error_message_names_the_states_the_allowed_ones_and_the_fix(
    old: ReplicaState, new: ReplicaState, expected: str
) -> None:
    with pytest.raises(ReplicaTransitionError) as info:
        check_transition(old, new, "fraud-scorer-0")
    message = str(info.value)
    assert expected in message
    assert "TRANSITIONS in schemas/replica_state.py" in message
    assert isinstance(info.value, SieError)


# ------------------------------------------------------------------------------------ reading and writing


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("READY", S.READY),
        (S.CRASHED, S.CRASHED),
        ("UNSCHEDULABLE", S.UNSCHEDULABLE),
        (None, S.UNKNOWN),
        ("", S.UNKNOWN),
        ("HIBERNATING", S.UNKNOWN),  # a newer writer's symbol
        ("ready", S.UNKNOWN),  # symbols are case-sensitive, as in Avro
    ],
)
def test_parse_state(value: object, expected: ReplicaState) -> None:
    assert parse_state(value) is expected


def test_enum_is_its_symbol_in_json_str_and_avro() -> None:
    assert json.dumps({"state": S.READY}) == json.dumps({"state": "READY"})
    assert str(S.READY) == f"{S.READY}" == "READY"
    record = {"replica_id": "r1", "node": "node-a", "model": "m", "version": "1", "state": "CRASHED",
              "reason": "OOM killed", "exit_code": None, "signal": 9, "restarts": 2, "ts_ms": 5}
    assert avro_codec.encode("ReplicaStatus", {**record, "state": S.CRASHED}) == avro_codec.encode("ReplicaStatus", record)
    assert parse_state(avro_codec.decode(avro_codec.encode("ReplicaStatus", record))["state"]) is S.CRASHED


def test_model_status_record_is_unchanged_and_round_trips() -> None:
    from sie.control.reconcile.status import ModelStatus, ReplicaView

    views = (
        ReplicaView("m-0", "m", "1", "node-a", (0,), 4096, S.READY, None, 0, "1"),
        ReplicaView("m-1", "m", "1", None, (), 0, S.UNSCHEDULABLE, "unschedulable: needs 4096 MiB"),
    )
    status = ModelStatus("m", "1", "P0", "scoring", "Degraded", "m-1: unschedulable: needs 4096 MiB", 2, 1, views, 3, 8)
    record = status.to_record()
    assert [type(r["state"]) for r in record["replicas"]] == [str, str]
    plain = json.loads(json.dumps(record))
    assert [r["state"] for r in plain["replicas"]] == ["READY", "UNSCHEDULABLE"]
    assert avro_codec.encode("ModelStatus", record) == avro_codec.encode("ModelStatus", plain)
    back = ModelStatus.from_record(avro_codec.decode(avro_codec.encode("ModelStatus", record)))
    assert back == status and back.replicas[1].state is S.UNSCHEDULABLE
