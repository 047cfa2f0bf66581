"""The per-result rules of a rollout (issue 34), one helper for the e2e tests and the campaign
(``tests/test_rollout_exact_e2e.py``, ``bench/rollout_campaign.py``).

Every committed output of a rollout's model (results and dead letters, read_committed) is checked against what
the rules say it must be:

    epochs = the leader's rollout records of the model (the rollouts topic's history): epoch -> weight, phase
    for each output, in request order per key:
        want = weighted_table(stable, canary, weight of its sie.routing.epoch).route(key, id).version
        off-weight  if its version != want, it carries sie.routing.fallback, or its code != its version label
        early       if its version is the canary at a weight-0 epoch before the first canary step
        flip-back   if its key was answered by the canary before and this output is the stable version, unless its
                    epoch is a rollback's (weight 0 in RollingBack / RolledBack)

Nothing asserts here: ``AnswerReport`` counts and names each finding (request id, key, epoch, version), so a run
reports them all, and the tests assert on the report.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import orjson

from sie.kernel.settings import Settings
from sie.streams.scorer.rollout import EPOCH_HEADER, weighted_table
from tests.support.scorer_fixtures import request_id_of_dead_letter

#: phases whose weight-0 epochs are a rollback: a key the canary answered may go back to stable then
ROLLBACK_PHASES = frozenset({"RollingBack", "RolledBack"})
FALLBACK_HEADER = "sie.routing.fallback"


@dataclass(frozen=True)
class EpochInfo:
    weight_bp: int
    phase: str


@dataclass
class AnswerReport:
    """What every committed output of one rollout showed (``check_answers``)."""

    answers: int = 0
    dead_letters: int = 0
    off_weight: list[str] = field(default_factory=list)
    flip_back: list[str] = field(default_factory=list)
    canary_before_step: list[str] = field(default_factory=list)
    #: "epoch E (W%, phase) version" -> outputs
    by_epoch: dict[str, int] = field(default_factory=dict)

    @property
    def clean(self) -> bool:
        return not (self.off_weight or self.flip_back or self.canary_before_step)

    def summary(self) -> str:
        return (f"{self.answers} results + {self.dead_letters} dead letters; off their epoch's weight "
                f"{len(self.off_weight)}, keys flipping back {len(self.flip_back)}, canary answers before its "
                f"canary step {len(self.canary_before_step)}")

    def findings(self, limit: int = 5) -> list[str]:
        return ([f"off-weight: {f}" for f in self.off_weight[:limit]]
                + [f"flip-back: {f}" for f in self.flip_back[:limit]]
                + [f"before canary step: {f}" for f in self.canary_before_step[:limit]])


def rollout_epochs(settings: Settings, model: str, timeout: float = 30.0) -> dict[int, EpochInfo]:
    """epoch -> (canary weight, phase) of every rollout record the leader committed for ``model`` (the rollouts
    topic read to its end, read_committed); epoch -1 (outputs before the rollout's first record) is weight 0."""
    from confluent_kafka import Consumer, TopicPartition

    from sie.schemas.avro_codec import Codec

    topic = settings.names.system_topic("rollouts")
    consumer = Consumer(settings.kafka_client_config(**{
        "group.id": f"epochs-{uuid.uuid4().hex[:8]}", "enable.auto.commit": False,
        "isolation.level": "read_committed", "enable.partition.eof": True}))
    codec = Codec()
    epochs = {-1: EpochInfo(0, "before"), 0: EpochInfo(0, "Pending")}
    try:
        parts = sorted(consumer.list_topics(topic, timeout=10).topics[topic].partitions)
        consumer.assign([TopicPartition(topic, p, -2) for p in parts])
        at_end: set[int] = set()
        deadline = time.monotonic() + timeout
        while len(at_end) < len(parts) and time.monotonic() < deadline:
            m = consumer.poll(0.5)
            if m is None:
                continue
            if m.error():
                if m.error().code() == -191:  # _PARTITION_EOF
                    at_end.add(m.partition())
                continue
            if m.value() is None:
                continue
            r = codec.decode(m.value(), expected="Rollout")
            if r["model"] != model:
                continue
            epoch, weight = int(r["epoch"]), int(r["weight_bp"])
            known = epochs.get(epoch)
            # an epoch's weight never changes; its phase may (Canary -> RollingBack keeps no epoch: weight moves)
            if known is None or known.phase not in ROLLBACK_PHASES:
                epochs[epoch] = EpochInfo(weight, str(r["phase"]))
        if len(at_end) < len(parts):
            raise AssertionError(f"the rollouts topic {topic} was not read to its end within {timeout:g}s")
    finally:
        consumer.close()
    return epochs


def check_answers(results: list[Any], dead_letters: list[Any], epochs: dict[int, EpochInfo], stable: str,
                  canary: str) -> AnswerReport:
    """Every output against its epoch's weight at its key's bucket, and each key's history (module docstring)."""
    report = AnswerReport(answers=len(results), dead_letters=len(dead_letters))
    first_canary_epoch = min((e for e, i in epochs.items() if i.weight_bp > 0), default=None)
    history: dict[bytes, list[tuple[int, str, int, str]]] = {}  # key -> (request n, version, epoch, id)
    outputs: list[tuple[Any, str, str, str | None]] = []  # (message, id, version label, code that answered)
    for m in results:
        doc = orjson.loads(m.value())
        outputs.append((m, str(doc["id"]), str(doc["version"]), str((doc.get("outputs") or {}).get("built", ""))))
    for m in dead_letters:
        headers = dict(m.headers() or [])
        version = headers.get("sie.version", b"").decode()
        outputs.append((m, request_id_of_dead_letter(m.value(), headers), version, None))
    for m, rid, version, built in outputs:
        headers = dict(m.headers() or [])
        epoch = int(headers[EPOCH_HEADER]) if EPOCH_HEADER in headers else -1
        info = epochs.get(epoch)
        key = m.key() or b""
        where = f"{rid} (key {key.decode(errors='replace')}, partition {m.partition()}, offset {m.offset()})"
        if info is None:
            report.off_weight.append(f"{where} by {version} at epoch {epoch}: no rollout record has that epoch")
            continue
        want = weighted_table((stable, None), (canary, None), info.weight_bp).route(key, rid).version
        kind = "result" if built is not None else "dead letter"
        if built is not None and built and built != version:
            report.off_weight.append(f"{where} labelled {version}, answered by code {built}")
        if version != want or FALLBACK_HEADER in headers:
            report.off_weight.append(
                f"{kind} {where} by {version} at epoch {epoch} ({info.weight_bp / 100:g}%, {info.phase}): its "
                f"bucket says {want}; fallback {headers.get(FALLBACK_HEADER)!r}")
        if version == canary and info.weight_bp == 0 and (first_canary_epoch is None or epoch < first_canary_epoch):
            report.canary_before_step.append(f"{kind} {where} by {version} at epoch {epoch} ({info.phase})")
        label = f"epoch {epoch} ({info.weight_bp / 100:g}%, {info.phase}) {version}"
        report.by_epoch[label] = report.by_epoch.get(label, 0) + 1
        try:
            n = int(rid.rsplit("-", 1)[1])
        except (IndexError, ValueError):
            n = -1
        history.setdefault(key, []).append((n, version, epoch, rid))
    for key, answers in history.items():
        answers.sort()
        canary_at: tuple[int, str] | None = None
        for _n, version, epoch, rid in answers:
            if version == canary and canary_at is None:
                canary_at = (epoch, rid)
            elif version == stable and canary_at is not None:
                info = epochs.get(epoch)
                if info is None or info.weight_bp != 0 or info.phase not in ROLLBACK_PHASES:
                    report.flip_back.append(
                        f"key {key.decode(errors='replace')}: {rid} by {stable} at epoch {epoch} after {canary_at[1]} "
                        f"by {canary} at epoch {canary_at[0]}")
                else:
                    canary_at = None  # rolled back: the key's history starts again
    return report
