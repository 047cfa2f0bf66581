"""Topic provisioning against the real broker: idempotent, fixes policy drift, never shrinks."""

from __future__ import annotations

import uuid

import pytest
from click.testing import CliRunner

from sie.commands.topics import command as topics_cli
from sie.infra.kafka.local import LocalKafka
from sie.kernel.admin import (
    Action,
    cluster_broker_count,
    delete_topics,
    ensure_model_topics,
    ensure_topics,
    topic_configs,
    wait_for_cluster,
)
from sie.kernel.errors import ConfigError
from sie.kernel.names import ModelTopics
from sie.kernel.settings import Settings
from sie.kernel.topics import TopicSpec, system_topics
from tests.support.helpers import unique_topic


def _prefix() -> str:
    return f"t{uuid.uuid4().hex[:10]}"


def test_system_topics_ensure_is_idempotent(kafka_settings: Settings) -> None:
    specs = system_topics(_prefix())
    first = ensure_topics(kafka_settings, specs)
    try:
        assert sorted(first.created) == sorted(s.name for s in specs)
        second = ensure_topics(kafka_settings, specs)
        assert second.created == [] and second.fixed == [] and second.mismatches == []
        assert sorted(second.existing) == sorted(s.name for s in specs)
        for spec, outcome in zip(specs, second.topics):
            assert outcome.partitions == spec.partitions
            configs = topic_configs(kafka_settings, spec.name)
            assert configs["cleanup.policy"] == ("compact" if spec.compacted else "delete"), spec.name
            # heartbeats carry the broker's time, never the agent's clock (control-plane liveness)
            assert configs["message.timestamp.type"] == (
                "LogAppendTime" if spec.name.endswith(".heartbeats") else "CreateTime"), spec.name
            # the replayed control topics close a segment after an hour of writes: the cleaner can compact it
            replayed = spec.name.rsplit(".", 1)[1] in ("specs", "nodes", "assignments", "control-leader",
                                                       "model-status", "connectors", "rollouts")
            assert (configs["segment.ms"] == "3600000") == replayed, spec.name
    finally:
        delete_topics(kafka_settings, [s.name for s in specs])


def test_policy_drift_is_fixed_and_partition_mismatch_reported(kafka_settings: Settings) -> None:
    name = unique_topic("drift")
    ensure_topics(kafka_settings, [TopicSpec(name, 2, compacted=False, purpose="test")])
    try:
        report = ensure_topics(kafka_settings, [TopicSpec(name, 4, compacted=True, purpose="test")])
        [outcome] = report.topics
        assert outcome.action is Action.FIXED and outcome.policy == "compact"
        assert topic_configs(kafka_settings, name)["cleanup.policy"] == "compact"
        assert outcome.partitions == 2  # never changed by ensure
        assert any("has 2 partitions, wants 4" in m for m in report.mismatches)
        again = ensure_topics(kafka_settings, [TopicSpec(name, 2, compacted=True, purpose="test")])
        assert again.topics[0].action is Action.EXISTING and again.mismatches == []
        stamped = ensure_topics(kafka_settings, [TopicSpec(name, 2, compacted=True, purpose="test",
                                                           config={"message.timestamp.type": "LogAppendTime"})])
        assert stamped.topics[0].action is Action.FIXED
        assert "message.timestamp.type was CreateTime, set to LogAppendTime" in stamped.topics[0].notes
        assert topic_configs(kafka_settings, name)["message.timestamp.type"] == "LogAppendTime"
    finally:
        delete_topics(kafka_settings, [name])


def test_model_topics_share_the_request_partition_count(kafka_settings: Settings) -> None:
    topics = ModelTopics.default_for(f"m{uuid.uuid4().hex[:8]}", prefix=_prefix())
    names = [topics.requests, topics.results, topics.dead_letters, topics.backfill_results]
    report = ensure_model_topics(kafka_settings, names, partitions=3)
    try:
        assert sorted(report.created) == sorted(names)
        assert {t.partitions for t in report.topics} == {3}
        assert {t.policy for t in report.topics} == {"delete"}
        md = wait_for_cluster(kafka_settings)
        assert all(len(md.topics[n].partitions) == 3 for n in names)
    finally:
        delete_topics(kafka_settings, names)


def test_replication_above_broker_count_is_a_config_error(kafka_settings: Settings) -> None:
    too_many = cluster_broker_count(kafka_settings) + 1
    with pytest.raises(ConfigError, match=f"replication factor {too_many} needs"):
        ensure_topics(kafka_settings, [TopicSpec(unique_topic("rf"), 1, False, "test")], replication_factor=too_many)


def test_delete_topics_skips_unknown(kafka_settings: Settings) -> None:
    assert delete_topics(kafka_settings, [unique_topic("never-created")]) == []


def test_cli_ensure_prints_table_then_existing(kafka_settings: Settings) -> None:
    prefix = _prefix()
    count = len(system_topics(prefix))
    runner = CliRunner()
    try:
        first = runner.invoke(topics_cli, ["ensure", "--prefix", prefix], obj=kafka_settings)
        assert first.exit_code == 0, first.output
        assert f"{prefix}.specs" in first.output and "created" in first.output
        assert f"{count} created, 0 fixed, 0 existing" in first.output
        second = runner.invoke(topics_cli, ["ensure", "--prefix", prefix], obj=kafka_settings)
        assert f"0 created, 0 fixed, {count} existing" in second.output
    finally:
        delete_topics(kafka_settings, [s.name for s in system_topics(prefix)])


def test_three_brokers_get_rf3_and_min_isr_2(kafka_cluster3: LocalKafka) -> None:
    settings = kafka_cluster3.settings_for_clients()
    assert cluster_broker_count(settings) == 3
    specs = system_topics(_prefix())
    report = ensure_topics(settings, specs)
    assert {t.replication for t in report.topics} == {3}
    for spec in specs:
        configs = topic_configs(settings, spec.name)
        assert configs["min.insync.replicas"] == "2", spec.name
        assert configs["cleanup.policy"] == ("compact" if spec.compacted else "delete")


def test_group_progress_reads_the_backlog_and_never_creates_a_missing_topic(kafka_settings: Settings) -> None:
    """A broker with auto.create.topics.enable creates a topic an AdminClient asks metadata for; the
    autoscaler's sampler reads before the worker creates the model's topics, so it must not."""
    from sie.kernel.admin import admin_client, group_progress
    from tests.support.helpers import produce_json

    missing, name = unique_topic("progress-missing"), unique_topic("progress")
    admin = admin_client(kafka_settings)
    empty = group_progress(admin, "no-such-group", missing)
    assert (empty.partitions, empty.lag) == (0, 0)
    ensure_model_topics(kafka_settings, [name], partitions=3)
    try:
        produce_json(kafka_settings, name, [{"id": str(i)} for i in range(7)])
        progress = group_progress(admin, "never-committed", name)
        assert (progress.partitions, progress.end_total, progress.lag, progress.committed_total) == (3, 7, 7, 0)
        # (checked last: a broker creates an auto-created topic within its own time, well before this)
        assert missing not in wait_for_cluster(kafka_settings).topics
    finally:
        delete_topics(kafka_settings, [name])
