"""Ports, directories and ``server.properties`` of a local KRaft cluster (pure, no I/O).

One broker: combined broker+controller node 1 on ``base_port`` (clients) and
``base_port+1`` (controller), formatted ``--standalone``.
Three brokers: nodes 1-3 on ``base+0/+1``, ``base+2/+3``, ``base+4/+5`` with a
static ``controller.quorum.voters``; internal topics replicated 3 with min ISR 2.
Every node listens on and advertises 127.0.0.1, unless ``hosts`` gives each node
its own address (the partition campaign's brokers, each in its own network
namespace: tests/support/netns.py).

Settings every shape gets, and why:
- ``group.initial.rebalance.delay.ms=0``: the default 3 s delay would add 3 s to
  every test that starts a consumer group.
- ``offsets.topic.num.partitions=10`` / ``transaction.state.log.num.partitions=10``
  (default 50): the first group or transactional producer creates these topics;
  50 partitions x 3 replicas takes seconds on a 2-core machine.
- ``broker.session.timeout.ms=5000`` / ``broker.heartbeat.interval.ms=1000``
  (defaults 9000/2000): a SIGKILLed broker cannot re-register until the
  controller expires its old session, so this bounds a kill -> restart in fault
  tests at ~5 s; 5 missed 1 s heartbeats still tolerate a loaded 2-core box.
- ``auto.create.topics.enable`` stays at Kafka's default (true): SIE creates its
  own topics explicitly (``sie topics ensure``, ``sie.kernel.admin``) with the right
  partitions and policies, and keeping the default means the local cluster
  behaves like a stock one for ad-hoc tools and other engineers' tests.
- 3 brokers: ``default.replication.factor=3`` so auto-created topics survive a
  broker kill; ``min.insync.replicas`` is NOT set broker-wide (it would break
  acks=all on rf=1 test topics); ``sie.kernel.admin`` sets it to 2 on rf=3 topics.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

HOST = "127.0.0.1"
SUPPORTED_SHAPES = (1, 3)


@dataclass(frozen=True)
class NodeLayout:
    """One combined broker+controller process."""

    node_id: int
    broker_port: int
    controller_port: int
    dir: Path
    #: the address it listens on and advertises
    host: str = HOST

    @property
    def data_dir(self) -> Path:
        return self.dir / "data"

    @property
    def logs_dir(self) -> Path:
        return self.dir / "logs"

    @property
    def properties_file(self) -> Path:
        return self.dir / "server.properties"

    @property
    def server_log(self) -> Path:
        return self.logs_dir / "server.log"

    @property
    def stdout_log(self) -> Path:
        return self.logs_dir / "stdout.log"

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.broker_port}"


@dataclass(frozen=True)
class ClusterLayout:
    brokers: int
    base_port: int
    root: Path
    #: one address per node (empty: every node on ``HOST``)
    hosts: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.brokers not in SUPPORTED_SHAPES:
            raise ValueError(f"brokers: must be 1 or 3 (got {self.brokers})")
        if self.hosts and len(self.hosts) != self.brokers:
            raise ValueError(f"hosts: one address per broker (got {len(self.hosts)} for {self.brokers})")

    @property
    def nodes(self) -> tuple[NodeLayout, ...]:
        return tuple(
            NodeLayout(i + 1, self.base_port + 2 * i, self.base_port + 2 * i + 1, self.root / f"node-{i + 1}",
                       self.hosts[i] if self.hosts else HOST)
            for i in range(self.brokers)
        )

    def node(self, node_id: int) -> NodeLayout:
        for node in self.nodes:
            if node.node_id == node_id:
                return node
        raise KeyError(f"node {node_id} is not part of this {self.brokers}-broker cluster (nodes 1-{self.brokers})")

    @property
    def ports(self) -> list[int]:
        return [p for n in self.nodes for p in (n.broker_port, n.controller_port)]

    @property
    def bootstrap_servers(self) -> str:
        return ",".join(n.bootstrap for n in self.nodes)

    @property
    def quorum_voters(self) -> str:
        return ",".join(f"{n.node_id}@{n.host}:{n.controller_port}" for n in self.nodes)

    def server_properties(self, node: NodeLayout) -> dict[str, str]:
        """The broker config of one node, as an ordered dict."""
        internal_rf = "1" if self.brokers == 1 else "3"
        internal_isr = "1" if self.brokers == 1 else "2"
        host = node.host
        props = {
            "process.roles": "broker,controller",
            "node.id": str(node.node_id),
            "listeners": f"PLAINTEXT://{host}:{node.broker_port},CONTROLLER://{host}:{node.controller_port}",
            "advertised.listeners": f"PLAINTEXT://{host}:{node.broker_port},CONTROLLER://{host}:{node.controller_port}",
            "inter.broker.listener.name": "PLAINTEXT",
            "controller.listener.names": "CONTROLLER",
            "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,SSL:SSL,"
            "SASL_PLAINTEXT:SASL_PLAINTEXT,SASL_SSL:SASL_SSL",
            "log.dirs": str(node.data_dir),
            "num.partitions": "1",
            "offsets.topic.replication.factor": internal_rf,
            "offsets.topic.num.partitions": "10",
            "transaction.state.log.replication.factor": internal_rf,
            "transaction.state.log.min.isr": internal_isr,
            "transaction.state.log.num.partitions": "10",
            "share.coordinator.state.topic.replication.factor": internal_rf,
            "share.coordinator.state.topic.min.isr": internal_isr,
            "group.initial.rebalance.delay.ms": "0",
            "broker.session.timeout.ms": "5000",
            "broker.heartbeat.interval.ms": "1000",
        }
        if self.brokers == 1:
            props["controller.quorum.bootstrap.servers"] = f"{host}:{node.controller_port}"
        else:
            props["controller.quorum.voters"] = self.quorum_voters
            props["default.replication.factor"] = "3"
        return props


def render_properties(props: dict[str, str]) -> str:
    return "".join(f"{k}={v}\n" for k, v in props.items())
