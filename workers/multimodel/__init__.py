"""Multi-model worker processes: many small models in one process, each on its own exactly-once lane
(docs/density.md).  ``host.Host`` runs them, ``lane.Lane`` is one model, ``desired`` is the file the
agent (or an operator) rewrites to add or remove models without a restart."""
