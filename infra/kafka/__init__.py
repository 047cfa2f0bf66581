"""Local Apache Kafka for development and tests: jars from Maven Central, KRaft brokers on loopback."""

from sie.infra.kafka.fetch import ensure_jars, require_tool
from sie.infra.kafka.layout import ClusterLayout, NodeLayout
from sie.infra.kafka.local import LocalKafka, free_base_port, port_in_use, probe_brokers

__all__ = ["ClusterLayout", "LocalKafka", "NodeLayout", "ensure_jars", "free_base_port", "port_in_use", "probe_brokers", "require_tool"]
