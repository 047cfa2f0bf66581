"""Real Kafka for the test session (never a fake).

- ``bootstrap_servers`` / ``kafka_settings`` (session): the broker named by
  ``SIE_BOOTSTRAP_SERVERS`` when set (CI, the shared dev broker); otherwise a
  1-broker ``LocalKafka`` on free loopback ports in a temp dir, stopped at the end.
- ``kafka_cluster3`` (session, started on first use): 3 brokers on free ports,
  for fault tests; tests using it are marked ``cluster3`` automatically.
- ``private_kafka`` (function): a fresh single broker the test may kill/restart.
- ``secure_kafka`` (session, started on first use): a single broker with SASL_SSL (SCRAM-SHA-512), TLS and
  ACLs enforced (``sie kafka up --secure``); tests using it are marked ``secure_kafka`` automatically
  (``-m "not secure_kafka"`` deselects them).

Brokers started here are not detached: Ctrl-C in the terminal stops them too.
Tests that use any of these fixtures get the ``kafka`` marker automatically,
so ``-m "not kafka"`` runs the pure unit tests alone (a test that starts a broker itself is marked by hand).
Also automatic: ``k8s`` (tests/k8s: a real kube-apiserver), ``real_llm`` (a real vLLM server) and ``smoke``
(``SMOKE``: the single-broker tests the quick tier adds to the unit tests, ``./scripts/test.sh --quick``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from sie.infra.kafka.local import LocalKafka, free_base_port
from sie.kernel.settings import Settings

#: test files that run a real vLLM server (tests/real_llm.py), installed by scripts/real_llm/setup.sh
_REAL_LLM_TESTS = ("/test_real_vllm.py", "/test_agent_real_vllm.py")
_KAFKA_FIXTURES = {"bootstrap_servers", "kafka_settings", "kafka_cluster3", "private_kafka", "secure_kafka"}
#: the quick tier's tests on a broker (``smoke``): exactly once in both commit modes through the CLI's own scorer, a
#: crash at random moments in both, a poison record, and the cluster's happy path (control plane + two agents)
SMOKE = (
    "tests/streams/scorer/test_scorer_kafka.py::test_happy_path_one_result_per_request_same_key_and_partition",
    "tests/streams/scorer/test_scorer_kafka.py::test_sigkill_at_random_moments_loses_and_duplicates_nothing",
    "tests/streams/scorer/test_scorer_kafka.py::test_poison_lands_in_the_dlq_with_reason_and_valid_requests_are_scored",
    "tests/test_cluster_e2e.py::test_two_agents_place_and_score_two_models",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # the tests of tools CI installs in the background meanwhile (.ci/run) run last, the real vLLM server's and then
    # the Kubernetes ones; the first of each may wait for its install longer than a test's own timeout
    def late(item: pytest.Item) -> int:
        path = str(item.path)
        return 2 if "/tests/k8s/" in path else 1 if any(name in path for name in _REAL_LLM_TESTS) else 0

    items.sort(key=late)
    for rank, variable in ((1, "SIE_LLM_SETUP_WAIT_S"), (2, "SIE_K8S_TOOLS_WAIT_S")):
        first = next((item for item in items if late(item) == rank), None)
        wait_s = float(os.environ.get(variable) or 0)
        if first is not None and wait_s > 0:
            first.add_marker(pytest.mark.timeout(wait_s + 900))
    for item in items:
        if "/tests/k8s/" in str(item.path):
            item.add_marker(pytest.mark.k8s)
        if any(name in str(item.path) for name in _REAL_LLM_TESTS):
            item.add_marker(pytest.mark.real_llm)
        if item.nodeid.split("[", 1)[0] in SMOKE:
            item.add_marker(pytest.mark.smoke)
        names = set(getattr(item, "fixturenames", ()))
        if names & _KAFKA_FIXTURES:
            item.add_marker(pytest.mark.kafka)
        if "kafka_cluster3" in names:
            item.add_marker(pytest.mark.cluster3)
        if "secure_kafka" in names:
            item.add_marker(pytest.mark.secure_kafka)


@pytest.fixture(scope="session")
def base_settings() -> Settings:
    """The environment, read once for the whole session."""
    return Settings()


def _start_local(base_settings: Settings, brokers: int, data_dir: Path, secure: bool = False) -> LocalKafka:
    kafka = LocalKafka(base_settings, brokers=brokers, base_port=free_base_port(2 * brokers),
                       data_dir=data_dir, detach=False, secure=secure)
    kafka.up(timeout=180 if brokers == 3 else 90)
    return kafka


@pytest.fixture(scope="session")
def bootstrap_servers(base_settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    if os.environ.get("SIE_BOOTSTRAP_SERVERS"):
        from sie.kernel.admin import wait_for_cluster

        wait_for_cluster(base_settings, timeout=30)
        yield base_settings.bootstrap_servers
        return
    kafka = _start_local(base_settings, 1, tmp_path_factory.mktemp("kafka-session"))
    try:
        yield kafka.bootstrap_servers
    finally:
        kafka.down()


@pytest.fixture(scope="session")
def kafka_settings(base_settings: Settings, bootstrap_servers: str) -> Settings:
    return base_settings.with_overrides(bootstrap_servers=bootstrap_servers)


@pytest.fixture(scope="session")
def kafka_cluster3(base_settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalKafka]:
    """A 3-broker cluster of its own; ``kafka_cluster3.settings_for_clients()`` points at it."""
    kafka = _start_local(base_settings, 3, tmp_path_factory.mktemp("kafka-cluster3"))
    try:
        yield kafka
    finally:
        kafka.down()


@pytest.fixture()
def private_kafka(base_settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalKafka]:
    """A fresh single broker for this test alone (kill_broker/stop_broker/start_broker are fair game)."""
    kafka = _start_local(base_settings, 1, tmp_path_factory.mktemp("kafka-private"))
    try:
        yield kafka
    finally:
        kafka.down(timeout=10)


@pytest.fixture(scope="session")
def secure_kafka(base_settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalKafka]:
    """A secured single broker of its own: ``secure_kafka.settings_for_clients(user)`` connects as ``user``
    (default the super user ``admin``); ``secure_kafka.create_user(name)`` adds a SCRAM user."""
    kafka = _start_local(base_settings, 1, tmp_path_factory.mktemp("kafka-secure"), secure=True)
    try:
        yield kafka
    finally:
        kafka.down()
