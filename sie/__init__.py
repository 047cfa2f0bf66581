"""SIE: a Kafka-native inference cluster.

The one import root.  ``sie.kernel`` (settings, errors, names, Kafka clients,
topics) is the bottom layer and ``sie.cli``/``sie.commands``/``sie.demo`` the
top; the repository's other folders install under it: ``sie.schemas``
(contracts), ``sie.streams`` (the exactly-once layer, the scorer, the control
plane), ``sie.workers`` (execution plane), ``sie.connectors`` (edges),
``sie.infra`` and ``sie.examples``.  docs/development.md explains the layout.
"""

__version__ = "0.1.0"
