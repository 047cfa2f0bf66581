"""The partition campaign's driver (issue 27): network partitions, not only crashes, under a steady load.

Shared by tests/test_partition_campaign.py (the bounded CI profile; ``SIE_FAULT_CAMPAIGN=full`` for the full
one) and bench/bench_faults.py (``--partitions``: the table in bench/results/partitions.txt and
docs/reliability.md).

Every node has its own network namespace and address on a private test network (tests/support/netns.py)::

    b1 b2 b3    the brokers: a 3-broker KRaft cluster, each listening on and advertising its own address;
                model topics with replication factor 3 and min.insync.replicas 2
    a1 a2 a3    agent nodes: two ``sie score`` processes (scorer rig) or ``sie agent``s and their workers
    c1 c2       the two ``sie control`` instances (control rig)
    client      the load (requests, acks=all, idempotent) and the ``sie`` CLI
    obs         the test's own instruments: the read_committed tail, admin lookups; never cut

The cases (a partition is a link taken down, ``Topology.cut``, or packets dropped between two nodes,
``Topology.block``; both silent, like a real partition: no RST, no ICMP)::

    1 a scorer's node cut from every broker past its session timeout, then healed: the other scorer takes
      its partitions and keeps its own flowing (<= HEALTHY_BOUND_S); the healed one rejoins, is fenced
      (its old generation's offsets are refused, its open transaction aborted), nothing is doubled
    2 an agent's node cut (its workers keep running, cut off too): the control plane places the replica on
      another node; on heal the stale worker is stopped and its writes never become visible
    3 the control-plane leader's node cut: the standby leads; on heal the old leader never writes with its
      old epoch
    4 a partial partition: a scorer's node reaches one broker only, not its partitions' leaders or its
      transaction coordinator
    5 the client (the load's producer) cut and healed: its idempotent producer delivers each request once
    6 a broker cut from the other two (a minority of one) while clients still reach it: no write that was
      acknowledged (acks=all, min ISR 2) is lost
    7 flapping: a scorer's link down and up every few seconds for a while

Each trial measures, from the arrivals of committed outputs (read_committed) per request partition: the
**stall** (longest gap between two outputs of one partition around the fault), the **healthy stall** (the
same over the partitions whose owner was not cut), the **recovery** (fault -> every partition answered a
request produced after the fault) and **after heal** (heal -> every partition answered a request produced
after the heal: a partition still silent then is stalled with its link back).  After each trial every
request delivered so far must have exactly one committed output (result or dead letter): lost, doubled.
"""

from __future__ import annotations

import contextlib
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from sie.infra.kafka.local import LocalKafka
from sie.kernel.settings import Settings
from tests.support.fault_campaign import (
    Load,
    Observer,
    group_coordinator,
    partition_leaders,
    txn_coordinator,
)
from tests.support.helpers import wait_until
from tests.support.netns import Topology
from tests.support.scorer_fixtures import ScorerProcess, echo_spec_doc

NODES = ("b1", "b2", "b3", "a1", "a2", "a3", "c1", "c2", "client", "obs")
#: a healthy scorer's own partitions may stall this long while another scorer is cut off (issue 27)
HEALTHY_BOUND_S = 5.0
#: no partition may stay silent longer than this after a link healed (issue 27)
HEAL_BOUND_S = 20.0
#: the scorers' consumer-group session timeout (SIE's default)
SESSION_S = 10.0
#: the bound of the cut-off scorer's own partitions: its session (10 s) + the rebalance + the wait for the offsets
#: its open transaction holds (transaction timeout 10 s, clients.eos_transaction_timeout_ms, + the coordinator's
#: abort sweep every 10 s), x1.5 for a loaded 2-core host
CUT_BOUND_S = 45.0
PARTITIONS = 6


# --------------------------------------------------------------------------------------------- results


@dataclass(frozen=True)
class PartitionResult:
    case: str
    target: str
    stall_s: float
    healthy_stall_s: float | None
    recovery_s: float
    heal_s: float | None
    bound_s: float
    delivered: int
    lost: int
    doubled: int
    note: str = ""
    #: the healthy stall's bound (None: reported, not judged)
    healthy_bound_s: float | None = None
    #: heal -> every partition answered
    heal_bound_s: float = HEAL_BOUND_S

    def row(self) -> str:
        def num(v: float | None) -> str:
            return "-" if v is None else f"{v:.2f}"

        return (f"| {self.case} | {self.target} | {num(self.stall_s)} | {num(self.healthy_stall_s)} | "
                f"{num(self.recovery_s)} | {num(self.heal_s)} | {self.bound_s:g} | {self.delivered} | {self.lost} | "
                f"{self.doubled} | {self.note} |")


TABLE_HEADER = ("| case | target | stall (s) | healthy stall (s) | recovery (s) | after heal (s) | bound (s) | requests "
                "| lost | doubled | notes |\n|---|---|---|---|---|---|---|---|---|---|---|")


def held(result: PartitionResult) -> None:
    """The campaign's assertions on one trial (AssertionError naming the result)."""
    assert result.lost == 0 and result.doubled == 0, result
    assert result.stall_s < result.bound_s and result.recovery_s < result.bound_s, result
    if result.healthy_stall_s is not None and result.healthy_bound_s is not None:
        assert result.healthy_stall_s <= result.healthy_bound_s, f"a healthy scorer's own partitions stalled: {result}"
    if result.heal_s is not None:
        assert result.heal_s <= result.heal_bound_s, f"a partition stayed stalled after the heal: {result}"


# ------------------------------------------------------------------------------------------ the network


class TestNet:
    """The test network (``Topology``) with a 3-broker cluster on b1-b3; the calling thread works from ``obs``.

    ``start()`` moves the calling thread into the observer node (every Kafka client the test makes from
    then on lives there: ``Topology.entered``) until ``close()``, which always stops the brokers and removes
    the namespaces, whatever failed before.
    """

    __test__ = False  # not a pytest class

    def __init__(self, settings: Settings, root: Path) -> None:
        self.root = Path(root)
        self.topo = Topology(NODES)
        self._stack = contextlib.ExitStack()
        self.kafka: LocalKafka | None = None
        self._base = settings

    def start(self, timeout: float = 240.0) -> TestNet:
        try:
            self._stack.callback(self.topo.close)
            self.topo.build()
            self._stack.enter_context(self.topo.entered("obs"))
            self.kafka = LocalKafka(self._base, brokers=3, base_port=19092, data_dir=self.root / "kafka",
                                    hosts=[self.topo.address(f"b{i}") for i in (1, 2, 3)],
                                    launcher=lambda node: self.topo.prefix(f"b{node.node_id}"), detach=False)
            self._stack.callback(self.kafka.down, 20)
            self.kafka.up(timeout=timeout)
        except BaseException:
            self.close()
            raise
        return self

    @property
    def settings(self) -> Settings:
        assert self.kafka is not None
        return self.kafka.settings_for_clients()

    def broker_node(self, broker_id: int) -> str:
        return f"b{broker_id}"

    def close(self) -> None:
        self.topo.heal_all()
        self._stack.close()


@contextlib.contextmanager
def test_net(settings: Settings, root: Path | None = None) -> Iterator[TestNet]:
    with contextlib.ExitStack() as stack:
        if root is None:
            root = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="sie-netns-")))
        net = TestNet(settings, root).start()
        stack.callback(net.close)
        yield net


# --------------------------------------------------------------------------------------- scorer rig


class ScorerNet:
    """Two ``sie score`` processes (echo model, static membership off) on nodes a1 and a2, a load from the
    client node, the tail on obs; ``PARTITIONS`` request partitions."""

    def __init__(self, net: TestNet, root: Path, rate_per_s: float = 60.0,
                 scorer_env: dict[str, str] | None = None) -> None:
        from sie.kernel.admin import ensure_model_topics
        from sie.schemas.spec import load

        self.net, self.topo = net, net.topo
        self.settings = net.settings.with_overrides(request_partitions=PARTITIONS)
        doc = echo_spec_doc(f"part-{uuid.uuid4().hex[:8]}")
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        spec_path = self.root / f"{doc['metadata']['name']}.yaml"
        spec_path.write_text(yaml.safe_dump(doc), encoding="utf-8")
        self.spec = load(doc, topic_prefix=self.settings.topic_prefix)
        t = self.spec.topics
        self.topics = {"requests": t.requests, "results": t.results, "dead_letters": t.dead_letters}
        report = ensure_model_topics(self.settings, list(self.topics.values()), PARTITIONS)
        assert {o.replication for o in report.topics} == {3}, report.table()
        self.group_id = self.spec.group_id
        self.nodes = ("a1", "a2")
        self.scorers = {
            node: ScorerProcess(spec_path, self.settings.bootstrap_servers, node, self.root, "--log-level", "info",
                                "--partitions", str(PARTITIONS), "--session-timeout-ms", str(int(SESSION_S * 1000)),
                                env=scorer_env, prefix=self.topo.prefix(node))
            for node in self.nodes}
        for proc in self.scorers.values():
            wait_until(proc.ready, 120, interval=0.2, message=lambda p=proc: f"scorer ready:\n{p.output()[-2000:]}")
        with self.topo.entered("client"):  # the load's producer (and its thread) live on the client node
            self.load = Load(self.settings, t.requests, lambda n: {"x": float(n)}, "p", rate_per_s).start()
        self.observer = Observer(self.settings, self.topics, self.load, PARTITIONS)
        self.observer.diagnose = self.diagnose
        self._log_seen = {node: 0 for node in self.nodes}
        self._proof: tuple[int, int, int] | None = None
        self.steady()

    def transactional_id(self, node: str) -> str:
        return self.settings.names.scorer_transactional_id(self.spec.name, node)

    # -- state ---------------------------------------------------------------------------------------------
    def owners(self) -> dict[str, set[int]]:
        """node -> the request partitions its scorer owns now (the group's view; a node absent owns nothing)."""
        from sie.kernel.admin import admin_client

        admin = admin_client(self.settings)
        desc = admin.describe_consumer_groups([self.group_id], request_timeout=5)[self.group_id].result(timeout=10)
        out: dict[str, set[int]] = {}
        for member in desc.members:
            node = next((n for n in self.nodes if member.client_id.startswith(self.transactional_id(n))), None)
            if node is not None and member.assignment is not None:
                out[node] = {tp.partition for tp in member.assignment.topic_partitions
                             if tp.topic == self.topics["requests"]}
        return out

    def _both_own(self) -> dict[str, set[int]] | None:
        try:
            owners = self.owners()
        except Exception:  # noqa: BLE001 - the group is between generations: ask again
            return None
        return owners if all(owners.get(n) for n in self.nodes) else None

    def steady(self, timeout: float = 120.0) -> dict[str, set[int]]:
        """Both scorers own partitions and every partition answers: the trial starts from a flowing load."""
        owners = wait_until(self._both_own, timeout, 0.2,
                            message=lambda: f"both scorers owning request partitions{self.diagnose()}")
        self.observer.steady(timeout)
        self.said()  # what they said before the trial is not the trial's
        return owners

    def alive(self) -> None:
        for node, proc in self.scorers.items():
            assert proc.proc.poll() is None, (
                f"sie score on {node} exited with {proc.proc.returncode}:\n{proc.output()[-3000:]}")

    def said(self) -> str:
        """What the scorers' exactly-once layers warned about since the last call, short (the recovery path)."""
        out = []
        for node, proc in self.scorers.items():
            text = proc.output()
            new, self._log_seen[node] = text[self._log_seen[node]:], len(text)
            lines = []
            for line in new.splitlines():
                if " sie.eos: " in line and ("ERROR" in line or "WARNING" in line):
                    msg = line.split(" sie.eos: ", 1)[1].split(" (dropped")[0].split("; re-creating")[0][:100]
                    if msg not in lines:
                        lines.append(msg)
            if lines:
                out.append(f"{node}: " + " / ".join(lines[:4]))
        return "; ".join(out)

    def diagnose(self) -> str:
        try:
            leaders = partition_leaders(self.settings, self.topics["requests"])
        except Exception as exc:  # noqa: BLE001 - context for a failure message only
            leaders = {-1: repr(exc)}  # type: ignore[dict-item]
        logs = "\n".join(f"--- scorer {n}:\n{p.output()[-2000:]}" for n, p in self.scorers.items())
        return (f"\nrequest partition leaders {leaders}; delivered {len(self.load.delivered())}/{self.load._n}, "  # noqa: SLF001
                f"outputs {self.observer.tail.count()}\n{logs}")

    def _result(self, case: str, target: str, t0: float, t_heal: float | None, end: float, bound: float,
                note: str, healthy: set[int] | None = None, healthy_bound: float | None = None,
                heal_bound: float = HEAL_BOUND_S) -> PartitionResult:
        stalls, recovery = self.observer.per_partition(t0, end)
        delivered, lost, doubled = self.observer.settle()
        self.alive()
        said = self.said()
        began = dict(self.observer.stall_began)
        worst = max(stalls, key=lambda p: stalls[p])
        where = f"worst p{worst} from +{began[worst]:.1f} s"
        healthy_stall = None
        if healthy:  # while the fault lasted: after the heal the group shares the partitions out again
            during = self.observer.per_partition(t0, t_heal if t_heal is not None else end)[0]
            p = max(healthy, key=lambda p: during[p])
            healthy_stall = during[p]
            where += f", healthy worst p{p} from +{self.observer.stall_began[p]:.1f} s"
        heal_s = self.observer.per_partition(t_heal, end)[1] if t_heal is not None else None
        return PartitionResult(case, target, stalls[worst], healthy_stall, recovery, heal_s, bound,
                               delivered, lost, doubled, f"{note}; {where}" + (f"; {said}" if said else ""),
                               healthy_bound, heal_bound)

    # -- the cases ---------------------------------------------------------------------------------------------
    def cut_scorer(self, node: str = "a1", case: str = "1 scorer node cut from every broker past its session, "
                                                           "healed") -> PartitionResult:
        owners = self.steady()
        other = next(n for n in self.nodes if n != node)
        healthy = owners[other]
        obs = self.observer
        t0 = time.monotonic()
        self.topo.cut(node)
        try:
            # waited for past the bound: the trial still measures how long it took (``held`` judges it)
            obs.wait_answered_after(t0, 2 * CUT_BOUND_S, f"case {case}: every partition answered with {node} cut",
                                    also=lambda: time.monotonic() - t0 >= 1.5 * SESSION_S)
            moved = time.monotonic() - t0
        finally:
            self.topo.heal(node)
        t1 = time.monotonic()
        wait_until(self._both_own, 60, 0.2, message=lambda: f"{node} to rejoin after the heal{self.diagnose()}")
        rejoined = time.monotonic() - t1
        end = obs.wait_answered_after(t1, CUT_BOUND_S, f"case {case}: every partition answered after the heal")
        return self._result(case, f"{node} (owned p{sorted(owners[node])}; {other} p{sorted(healthy)})", t0, t1, end,
                            CUT_BOUND_S, f"cut {t1 - t0:.1f} s, all answered {moved:.1f} s into it, rejoined "
                                         f"{rejoined:.1f} s after the heal", healthy, HEALTHY_BOUND_S)

    def partial(self, node: str = "a1", keep: str = "group",
                case: str = "4 partial: a scorer node reaches one broker only") -> PartitionResult:
        """Node ``node`` reaches one broker only: every packet to the other two is dropped.  ``keep="group"``: the
        one it keeps is its group coordinator, so it stays in the group (heartbeats answered) while it cannot
        commit (its transaction coordinator or the leaders it writes to are among the other two): the stage's
        stall rule must give its partitions back (``sie.streams.eos.stage``).  ``keep="other"``: a broker that is
        not its group coordinator (its session then times out, as in a full cut)."""
        owners = self.steady()
        other = next(n for n in self.nodes if n != node)
        leaders = partition_leaders(self.settings, self.topics["requests"])
        txn = txn_coordinator(self.settings, self.transactional_id(node))[1]
        group = group_coordinator(self.settings, self.group_id)[1]
        if keep == "group":
            keep_id = group
        else:  # none of its coordinators
            keep_id = next(b for b in (1, 2, 3) if b not in (group, txn))
        cut_off = [b for b in (1, 2, 3) if b != keep_id]
        roles = (f"keeps broker {keep_id} ({'group coordinator' if keep_id == group else 'not its group coordinator'}"
                 f"{', txn coordinator' if keep_id == txn else ''}); txn coordinator {txn}, its partitions' "
                 f"leaders {sorted({leaders[p] for p in owners[node]})}")
        obs = self.observer
        t0 = time.monotonic()
        self.topo.block(node, [self.net.broker_node(b) for b in cut_off])
        try:
            obs.wait_answered_after(t0, 2 * CUT_BOUND_S, f"case {case}: every partition answered ({roles})",
                                    also=lambda: time.monotonic() - t0 >= 1.5 * SESSION_S)
            moved = time.monotonic() - t0
        finally:
            self.topo.unblock(node)
        t1 = time.monotonic()
        wait_until(self._both_own, 60, 0.2, message=lambda: f"{node} to own partitions again{self.diagnose()}")
        end = obs.wait_answered_after(t1, CUT_BOUND_S, f"case {case}: every partition answered after the heal")
        # the other scorer's partitions are reported, not judged: the stalled one, joining again, is given its share
        # of partitions, which may be some of them
        return self._result(case, f"{node}: {roles}", t0, t1, end, CUT_BOUND_S,
                            f"partial {t1 - t0:.1f} s, all answered {moved:.1f} s into it", owners[other])

    def cut_client(self, hold_s: float = 15.0, case: str = "5 client (load producer) cut, healed") -> PartitionResult:
        self.steady()
        obs = self.observer
        sent_before = self.load._n  # noqa: SLF001
        t0 = time.monotonic()
        self.topo.cut("client")
        try:
            wait_until(lambda: time.monotonic() - t0 >= hold_s, hold_s + 5, 0.2, message="the client's cut to last")
        finally:
            self.topo.heal("client")
        t1 = time.monotonic()
        end = obs.wait_answered_after(t1, HEAL_BOUND_S * 2, f"case {case}: every partition answered after the heal")
        queued = self.load._n - sent_before  # noqa: SLF001
        return self._result(case, "client", t0, t1, end, hold_s + HEAL_BOUND_S * 2,
                            f"cut {t1 - t0:.1f} s; {queued} requests produced meanwhile, delivered after the heal")

    def broker_minority(self, hold_s: float = 30.0,
                        case: str = "6 broker cut from the other two, clients still reach it") -> PartitionResult:
        """The leader of request partition 0 loses the other brokers (and the controller quorum) for ``hold_s`` but
        not the clients: acks=all with min ISR 2 must never acknowledge a write only it has.  Not waited on: every
        partition answering meanwhile; the isolated broker still answers metadata requests with what it knew
        (itself as the leader), so clients that ask it keep writing to it until the heal (notes).

        The heal's bound is ``CUT_BOUND_S``, not ``HEAL_BOUND_S``: the broker's return is a change inside Kafka
        (it rejoins the controller quorum, which it may have led, and leaders and transaction coordinators move
        again), and a scorer's transaction call caught in that move waits for the coordinator: measured 33.1 s
        heal -> answered (two 10 s abort attempts, the 25 s hang watchdog abandoning the producer, the new one's
        init waiting for the coordinator; every step logged), 3-13 s in other runs."""
        self.steady()
        leaders = partition_leaders(self.settings, self.topics["requests"])
        broker = leaders[0]
        others = [self.net.broker_node(b) for b in (1, 2, 3) if b != broker]
        obs = self.observer
        t0 = time.monotonic()
        self.topo.block(self.net.broker_node(broker), others)
        try:
            wait_until(lambda: time.monotonic() - t0 >= hold_s, hold_s + 5, 0.2, message="the isolation to last")
            answering = sorted(obs.answered_after(t0))
            led_then = sorted(p for p, b in partition_leaders(self.settings, self.topics["requests"]).items()
                              if b == broker)
        finally:
            self.topo.unblock(self.net.broker_node(broker))
        t1 = time.monotonic()
        end = obs.wait_answered_after(t1, 2 * CUT_BOUND_S, f"case {case}: every partition answered after the heal")
        return self._result(case, f"broker {broker} (led p{sorted(p for p, b in leaders.items() if b == broker)})",
                            t0, t1, end, hold_s + CUT_BOUND_S,
                            f"isolated {t1 - t0:.1f} s; partitions answering during it: {answering}; the "
                            f"controller's view then: it leads p{led_then}", heal_bound=CUT_BOUND_S)

    def flap(self, node: str = "a1", period_s: float = 3.0, duration_s: float = 45.0,
             case: str = "7 flapping link") -> PartitionResult:
        """Node ``node``'s link down and up every ``period_s`` for ``duration_s``; ``node="leader"``: the broker
        leading request partition 0 (every client's connections to it, and its own to the other brokers)."""
        self.steady()
        if node == "leader":
            node = self.net.broker_node(partition_leaders(self.settings, self.topics["requests"])[0])
        t0 = time.monotonic()
        flapper = self.topo.flap(node, period_s, duration_s)
        flapper.join(duration_s + 30)
        assert not flapper.is_alive(), "the flapper did not end"
        t1 = time.monotonic()
        end = self.observer.wait_answered_after(t1, CUT_BOUND_S, f"case {case}: every partition answered after the "
                                                                 f"last heal")
        wait_until(self._both_own, 60, 0.2, message=lambda: f"both scorers owning partitions{self.diagnose()}")
        return self._result(case, f"{node}, down/up every {period_s:g} s for {duration_s:g} s", t0, t1, end,
                            duration_s + CUT_BOUND_S, "")

    def close(self) -> tuple[int, int, int]:
        """Stop the load, the independent proof (requests, lost, doubled), stop the scorers (once: a second
        call returns the first proof)."""
        if self._proof is None:
            try:
                self._proof = self.observer.prove()
            finally:
                self.shutdown()
        return self._proof

    def shutdown(self) -> None:
        self.observer.close()
        for proc in self.scorers.values():
            proc.ensure_dead()


# --------------------------------------------------------------------------------------- control rig


class ControlNet:
    """The control rig of the crash campaign (``tests.support.fault_campaign.ControlRig``: two ``sie control``, two
    ``sie agent``s serving fraud-rules, 1 replica) with every process on its own node: control planes on c1/c2,
    agents (and their workers) on a1/a2, the load and the CLI on the client node."""

    def __init__(self, net: TestNet, root: Path, rate_per_s: float = 20.0) -> None:
        from tests.support.fault_campaign import ControlRig

        assert net.kafka is not None
        self.net, self.topo = net, net.topo
        self.rig = ControlRig(net.kafka, root, rate_per_s, net=net)
        self._models = 0

    def _result(self, case: str, r: Any) -> PartitionResult:
        t0, t_heal, end = self.rig.last_window
        heal_s = self.rig.observer.per_partition(t_heal, end)[1]
        return PartitionResult(case, r.target, r.stall_s, None, r.recovery_s, heal_s, r.bound_s, r.delivered, r.lost,
                               r.doubled, r.note)

    def cut_agent(self, case: str = "2 agent node cut (its worker keeps running, cut off too), healed"
                  ) -> PartitionResult:
        """The replica moves to the other node (its new worker fences the cut-off one: same transactional id and
        static member id); on heal the agent stops its stale worker, whose writes never became visible."""
        return self._result(case, self.rig.agent_isolated(case, lambda p: self.topo.cut(p.host),
                                                          lambda p: self.topo.heal(p.host)))

    def cut_leader(self, case: str = "3 control-plane leader's node cut, healed") -> PartitionResult:
        """The standby leads (and places a model applied meanwhile); on heal the old leader steps down without
        one write under its old epoch."""
        self._models += 1
        return self._result(case, self.rig.leader_isolated(case, lambda p: self.topo.cut(p.host),
                                                           lambda p: self.topo.heal(p.host),
                                                           model=f"fraud-rules-p{self._models}"))

    def close(self) -> tuple[int, int, int]:
        return self.rig.close()

    def shutdown(self) -> None:
        self.rig.observer.close()
        self.rig.status.close()
        self.rig.c.close()
