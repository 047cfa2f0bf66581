"""Stable import path for the local cluster: ``from sie.kafka_local import LocalKafka``.

The implementation lives in the ``sie.kafka`` package (fetch, layout, local).
"""

from sie.kafka import ClusterLayout, LocalKafka, ensure_jars, port_in_use

__all__ = ["ClusterLayout", "LocalKafka", "ensure_jars", "port_in_use"]
