"""SIE: a Kafka-native inference cluster.

The ``sie`` package holds what every plane shares: typed settings and the CLI.
The planes themselves live in the top-level packages ``schemas`` (contracts),
``streams`` (stream processors), ``workers`` (execution plane) and
``connectors`` (edges).
"""

__version__ = "0.1.0"
