"""The test helpers (brokers' topics and reads, the cluster harness, fault and partition drivers, test models) and
their own tests. Tests import them as ``tests.support.<module>``; product code never does."""
