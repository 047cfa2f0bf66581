"""Contracts: the ModelService spec, the Avro schemas of every system topic,
request validation and schema compatibility checks."""
