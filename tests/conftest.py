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

Parallel runs (pytest-xdist, ``./scripts/test.sh`` passes ``-n``): each worker is its own session, so each starts its
own session broker unless ``SIE_BOOTSTRAP_SERVERS`` names one they share (CI: one broker, tests use unique topic
prefixes). Tests that bring up machinery of their own run in groups, so one worker runs each group and the JVMs and
namespaces never pile up (``GROUP_FILES``, ``--dist loadgroup``). Timeouts are per tier (``TIER_TIMEOUT_S``) where a test
does not set its own.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sie.infra.kafka.local import LocalKafka, free_base_port
from sie.kernel.settings import Settings

#: test files that run a real vLLM server (tests/support/real_llm.py), installed by scripts/real_llm/setup.sh
_REAL_LLM_TESTS = ("tests/streams/llm/test_real_vllm.py", "tests/streams/llm/test_real_vllm_edges.py",
                   "tests/workers/test_agent_real_vllm.py")
#: the network-namespace partition tests (root; brokers of their own in namespaces)
_NETNS_TESTS = ("tests/support/test_netns.py", "tests/test_partition_campaign.py")
_KAFKA_FIXTURES = {"bootstrap_servers", "kafka_settings", "kafka_cluster3", "private_kafka", "secure_kafka"}
#: the quick tier's tests on a broker (``smoke``): exactly once in both commit modes through the CLI's own scorer, a
#: crash at random moments in both, a poison record, and the cluster's happy path (control plane + two agents)
SMOKE = (
    "tests/streams/scorer/test_scorer_kafka.py::test_happy_path_one_result_per_request_same_key_and_partition",
    "tests/streams/scorer/test_scorer_kafka.py::test_sigkill_at_random_moments_loses_and_duplicates_nothing",
    "tests/streams/scorer/test_scorer_kafka.py::test_poison_lands_in_the_dlq_with_reason_and_valid_requests_are_scored",
    "tests/test_cluster_e2e.py::test_two_agents_place_and_score_two_models",
)


#: xdist groups: the files whose tests one worker runs together (``GroupScheduling``): the 3-broker cluster, the
#: secured broker and the network-namespace partition tests (brokers of their own: one group, so at most one such
#: cluster runs at a time; the partition topologies also share one test subnet), the Kubernetes tools (one
#: kube-apiserver) and the real vLLM servers (CPU-bound: two at once would each miss their deadlines).  By file, as
#: the scheduler sees only node ids; a test that needs one of these fixtures outside these files fails collection.
#: ``packaging``: its tests build SIE from this tree (``pip wheel .``, ``pip install --target``), and two builds at once
#: collide in the tree's ``build/`` ("File exists: build/bdist.linux-x86_64/wheel/sie-0.1.0.dist-info", seen in a
#: dry run once its tests landed on two workers at the same time).
GROUP_FILES = (
    ("heavy-brokers", ("tests/test_fault_campaign.py", "tests/kernel/test_topics.py", "tests/infra/test_kafka_secure.py",
                       "tests/streams/eos/test_unknown_outcome_cluster3.py", *_NETNS_TESTS)),
    ("k8s", ("tests/k8s/",)),
    ("real_llm", _REAL_LLM_TESTS),
    ("packaging", ("tests/test_packaging.py",)),
)
_GROUP_MARKS = {"heavy-brokers": {"cluster3", "secure_kafka", "netns"}, "k8s": {"k8s"}, "real_llm": {"real_llm"}}


def group_of(nodeid: str) -> str | None:
    """The xdist group of a test (``GROUP_FILES``), None for one any worker may run."""
    path = nodeid.split("::", 1)[0]
    return next((name for name, files in GROUP_FILES if any(path.startswith(f) for f in files)), None)


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadgroup`` by ``group_of``: pytest-xdist 3.8's own (an ``@group`` suffix it writes into the node id)
    does nothing on pytest 9, whose node ids no longer come from the attribute it writes."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return group_of(nodeid) or nodeid

    return GroupScheduling(config, log)


#: default timeout (s) per tier, for a test that sets none: unit tests, tests on a broker, tests with machinery of
#: their own (the most specific tier applies)
TIER_TIMEOUT_S = (("unit", 120), ("kafka", 300), ("heavy", 900))


def _tier_timeout(item: pytest.Item) -> int:
    marks = {mark.name for mark in item.iter_markers()}
    tier = "heavy" if marks & {"cluster3", "secure_kafka", "netns", "k8s", "real_llm", "fault_campaign"} else (
        "kafka" if "kafka" in marks else "unit")
    return dict(TIER_TIMEOUT_S)[tier]


def _k8s_tools_built() -> bool:
    """kube-apiserver, kubectl and helm already built on this machine (scripts/k8s_tools.sh --path: a stamp check)."""
    import subprocess

    tools = Path(__file__).resolve().parents[1] / "scripts" / "k8s_tools.sh"
    return subprocess.run([str(tools), "--path"], capture_output=True).returncode == 0


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # the longest group (brokers of its own) starts first, on a worker of its own; the tests of tools CI installs in
    # the background meanwhile (.ci/run) run last, the real vLLM server's and then the Kubernetes ones (those early,
    # beside the broker group, when the tools are already built); the first of each may wait for its install longer
    # than a test's own timeout.  Among the rest, files with a broker go first and the broker-free ones last: most of
    # the tests but a small part of the time, in pieces small enough to fill the workers while the last long tests
    # finish (files stay whole: a module's fixtures are set up once per worker)
    k8s_rank = -1 if _k8s_tools_built() else 2
    on_broker = {item.nodeid.split("::", 1)[0] for item in items
                 if set(getattr(item, "fixturenames", ())) & _KAFKA_FIXTURES or item.get_closest_marker("kafka")}

    def late(item: pytest.Item) -> tuple[int, int]:
        path, file = str(item.path), item.nodeid.split("::", 1)[0]
        if group_of(item.nodeid) == "heavy-brokers":
            return -1, 0
        if "/tests/k8s/" in path:
            return k8s_rank, 0
        return (1 if file in _REAL_LLM_TESTS else 0), (0 if file in on_broker else 1)

    items.sort(key=late)
    for rank, variable in ((1, "SIE_LLM_SETUP_WAIT_S"), (2, "SIE_K8S_TOOLS_WAIT_S")):
        first = next((item for item in items if late(item)[0] == rank), None)
        wait_s = float(os.environ.get(variable) or 0)
        if first is not None and wait_s > 0:
            first.add_marker(pytest.mark.timeout(wait_s + 900))
    for item in items:
        if "/tests/k8s/" in str(item.path):
            item.add_marker(pytest.mark.k8s)
        if item.nodeid.split("::", 1)[0] in _REAL_LLM_TESTS:
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
        if item.nodeid.split("::", 1)[0] in _NETNS_TESTS:
            item.add_marker(pytest.mark.netns)
        marks = {mark.name for mark in item.iter_markers()}
        needs = next((name for name, members in _GROUP_MARKS.items() if marks & members), None)
        if needs is not None and group_of(item.nodeid) != needs:
            raise pytest.UsageError(f"{item.nodeid} needs the {needs!r} group's machinery: add its file to that "
                                    "group in GROUP_FILES (tests/conftest.py), so one worker runs them together")
        if item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(_tier_timeout(item)))


@pytest.fixture(scope="session")
def base_settings() -> Settings:
    """The environment, read once for the whole session."""
    return Settings()


def _start_local(base_settings: Settings, brokers: int, data_dir: Path, secure: bool = False) -> LocalKafka:
    kafka = LocalKafka(base_settings, brokers=brokers, base_port=free_base_port(2 * brokers),
                       data_dir=data_dir, detach=False, secure=secure)
    kafka.up(timeout=180)  # four workers start theirs at once, beside the CI's background builds
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
