"""The replica state contract between node agents and the control plane.

WHY one module: an agent writes a replica's state (``ReplicaStatus`` / ``ReplicaReport`` on Kafka,
the Avro enum ``sie.v1.ReplicaState`` in ``schemas/avro/ReplicaState.avsc``) and the control plane
reads it back, adds states of its own (UNSCHEDULABLE, UNKNOWN) and publishes them in
``ModelStatus``.  Both sides spell every state through :class:`ReplicaState`, so a typo is an
``AttributeError`` at import time instead of a comparison that is silently never true.

The agent-side lifecycle is written down as :data:`TRANSITIONS` and enforced by
:func:`check_transition` (the supervisor calls it on every change): a transition missing from
the table is a bug in the supervisor, not something to publish.

``ReplicaState`` is a ``StrEnum``: each member *is* its symbol string (``ReplicaState.READY ==
"READY"``, ``json.dumps`` and ``str()`` give ``READY``), so Avro records and the HTTP API's JSON
are byte-identical to the plain strings used before.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any

from sie.kernel.errors import SieError


class ReplicaState(enum.StrEnum):
    """Where one replica is, as an agent reports it or as the control plane sees it.

    Reported by the agent that runs the replica (the Avro enum ``sie.v1.ReplicaState``):

    PENDING   desired, no process yet: first start, or assigned but not yet launched.  The control
              plane also shows PENDING for a replica it assigned that its agent has not reported yet.
    STARTING  process launched: loading the model and running the readiness inference.
    READY     the readiness inference passed; the scorer consumes requests.
    DRAINING  SIGTERM sent (no longer assigned, or its target changed): the scorer commits its current
              batch and leaves the consumer group; SIGKILL after the drain grace.  A replica replaced
              in place is DRAINING while it still serves, until its successor is loaded (hand-over,
              ``sie.workers.supervisor``).
    STOPPED   exited after a drain, or forgotten before it ever ran (terminal; the agent drops it
              from its table once reported).
    FAILED    crashed ``max_crashes`` times within the crash window, could not be started that
              often, or its spec was refused by the node's spec policy (terminal on this node; the
              control plane keeps it off the node for a cool-down and places it elsewhere).
    CRASHED   exited or was killed without being asked to; restarted after a backoff.

    Never reported by an agent:

    UNKNOWN        on the wire: the Avro enum's default, what a reader decodes a symbol it does not
                   know into (a newer agent's state); in ModelStatus: the replica's node is offline.
    UNSCHEDULABLE  control plane only (ModelStatus, where ``state`` is an Avro string, not this
                   enum): no eligible node has room for the replica; the reason says what is missing.
    """

    # The wire symbols, in the order of schemas/avro/ReplicaState.avsc (tests/test_replica_state.py).
    PENDING = "PENDING"
    STARTING = "STARTING"
    READY = "READY"
    DRAINING = "DRAINING"
    STOPPED = "STOPPED"
    FAILED = "FAILED"
    CRASHED = "CRASHED"
    UNKNOWN = "UNKNOWN"
    # Control plane only: not an Avro enum symbol.
    UNSCHEDULABLE = "UNSCHEDULABLE"

    @property
    def has_process(self) -> bool:
        """Whether a worker process exists in this state (the supervisor polls and signals it)."""
        return self in _WITH_PROCESS


_WITH_PROCESS = frozenset({ReplicaState.STARTING, ReplicaState.READY, ReplicaState.DRAINING})

#: the lifecycle states an agent reports (and the supervisor moves between)
AGENT_STATES: frozenset[ReplicaState] = frozenset(
    {
        ReplicaState.PENDING,
        ReplicaState.STARTING,
        ReplicaState.READY,
        ReplicaState.DRAINING,
        ReplicaState.STOPPED,
        ReplicaState.FAILED,
        ReplicaState.CRASHED,
    }
)

#: the symbols of the Avro enum ``sie.v1.ReplicaState`` (what ReplicaStatus / ReplicaReport carry)
WIRE_STATES: frozenset[ReplicaState] = AGENT_STATES | {ReplicaState.UNKNOWN}

#: states the control plane adds in ModelStatus (never sent by an agent)
CONTROL_PLANE_STATES: frozenset[ReplicaState] = frozenset({ReplicaState.UNKNOWN, ReplicaState.UNSCHEDULABLE})

_S = ReplicaState

#: The agent-side lifecycle: state -> the states the supervisor may move a replica to next.
#: Each edge names the supervisor path that takes it (``workers/supervisor.py``).
#:
#: Self-transitions are not allowed, because every transition publishes a ReplicaStatus and a
#: repeated state is usually a step that ran twice -- with one exception: CRASHED -> CRASHED is a
#: relaunch whose ``launcher.start`` raised, a new crash (a new reason and backoff, and it counts
#: towards ``max_crashes``) that the control plane must see.
TRANSITIONS: Mapping[ReplicaState, frozenset[ReplicaState]] = {
    _S.PENDING: frozenset(
        {
            _S.STARTING,  # launched
            _S.CRASHED,  # the launch itself failed (OSError, unreadable spec)
            _S.FAILED,  # ... and that was the max_crashes-th crash in the window; or the node's spec policy refused it
            _S.STOPPED,  # no longer assigned before it was launched
        }
    ),
    _S.STARTING: frozenset(
        {
            _S.READY,  # the worker's {"event": "ready"}: the readiness inference passed
            _S.CRASHED,  # exited, or killed (startup timeout)
            _S.FAILED,  # ... for the max_crashes-th time in the window
            _S.DRAINING,  # no longer assigned / target changed: SIGTERM
        }
    ),
    _S.READY: frozenset(
        {
            _S.CRASHED,  # exited, or killed (no progress within the liveness timeout)
            _S.FAILED,  # ... for the max_crashes-th time in the window
            _S.DRAINING,  # no longer assigned / target changed: SIGTERM
        }
    ),
    _S.DRAINING: frozenset({_S.STOPPED}),  # exited (by itself, or SIGKILL after the drain grace)
    _S.CRASHED: frozenset(
        {
            _S.STARTING,  # backoff elapsed: relaunched (restarts += 1)
            _S.CRASHED,  # the relaunch itself failed: another crash (see above)
            _S.FAILED,  # ... that was the max_crashes-th crash in the window; or the spec policy refused it
            _S.STOPPED,  # no longer assigned while waiting for its restart
        }
    ),
    _S.FAILED: frozenset({_S.STOPPED}),  # no longer assigned (the control plane moved it)
    _S.STOPPED: frozenset(),  # terminal: the supervisor forgets it
}


class ReplicaTransitionError(SieError):
    """A replica was asked to move between two states the lifecycle table does not connect."""


def allowed_next(state: ReplicaState) -> frozenset[ReplicaState]:
    """The states a replica in ``state`` may move to (none for control-plane-only states)."""
    return TRANSITIONS.get(state, frozenset())


def check_transition(old: ReplicaState, new: ReplicaState, replica_id: str | None = None) -> None:
    """Raise :class:`ReplicaTransitionError` unless ``old -> new`` is in :data:`TRANSITIONS`."""
    allowed = allowed_next(old)
    if new in allowed:
        return
    who = f"replica {replica_id}: " if replica_id else ""
    if old not in TRANSITIONS:
        options = f"none ({old.value} is never an agent-side state)"
    elif allowed:
        options = ", ".join(s.value for s in ReplicaState if s in allowed)
    else:
        options = f"none ({old.value} is terminal)"
    raise ReplicaTransitionError(
        f"{who}transition {old.value} -> {new.value} is not allowed; from {old.value} the allowed next "
        f"states are: {options}. This is a supervisor bug: fix the caller, or if the path is intended, "
        f"add it to TRANSITIONS in schemas/replica_state.py with a test"
    )


def parse_state(value: Any) -> ReplicaState:
    """A state as decoded from Avro or JSON (a symbol string, an enum, or None) -> ReplicaState.

    Readers map a symbol they do not know (written by a newer version) to UNKNOWN, as the Avro
    enum's default does, instead of failing on it.
    """
    if isinstance(value, ReplicaState):
        return value
    symbol = getattr(value, "value", value)
    try:
        return ReplicaState(str(symbol)) if symbol else ReplicaState.UNKNOWN
    except ValueError:
        return ReplicaState.UNKNOWN
