"""CDC connectors on Kafka: the compacted ``<prefix>.connectors`` topic, key = connector name.

Like models on the specs topic: the control plane's API writes ``ConnectorRecord`` values (the spec as
JSON, and whether an operator paused it) with an idempotent producer and waits for the acknowledgement;
a delete writes a ``deleted=true`` record and then a tombstone.  The leader places every connector that
is not paused as a CPU-only replica; pausing drains that replica (its stage commits its batch and leaves
the group: the committed offsets are where resuming starts), so pause/resume keeps exactly-once.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sie.kernel.settings import Settings
from sie.schemas.avro_codec import encode
from sie.schemas.connector_spec import CdcConnectorSpec, parse_connector_spec
from sie.schemas.spec_store import produce_acknowledged

RECORD = "ConnectorRecord"


@dataclass(frozen=True)
class ConnectorInfo:
    """A connector as the topic holds it."""

    spec: CdcConnectorSpec
    paused: bool
    applied_at_ms: int

    @property
    def name(self) -> str:
        return self.spec.name


def connectors_topic(settings: Settings) -> str:
    return settings.names.system_topic("connectors")


def connector_record(spec: CdcConnectorSpec, paused: bool, applied_at_ms: int, deleted: bool = False) -> dict[str, Any]:
    return {"name": spec.name, "spec_json": json.dumps(spec.model_dump(mode="json"), sort_keys=True,
                                                       separators=(",", ":")),
            "applied_at_ms": applied_at_ms, "paused": paused, "deleted": deleted}


def connector_from_record(record: dict[str, Any]) -> ConnectorInfo | None:
    """The connector of a record, None for a deleted one; raises ``ConnectorSpecError``/``ValueError``."""
    if record.get("deleted"):
        return None
    spec = parse_connector_spec(json.loads(record["spec_json"]), source=f"connector record {record.get('name')!r}")
    return ConnectorInfo(spec, bool(record.get("paused")), int(record.get("applied_at_ms") or 0))


def publish_connector(settings: Settings, spec: CdcConnectorSpec, paused: bool, timeout: float = 30.0,
                      clock: Callable[[], float] = time.time) -> dict[str, Any]:
    """Write the connector (and whether it is paused); returns the record once acknowledged."""
    record = connector_record(spec, paused, int(clock() * 1000))
    produce_acknowledged(settings, [(spec.name, encode(RECORD, record))], timeout, topic=connectors_topic(settings))
    return record


def delete_connector(settings: Settings, spec: CdcConnectorSpec, timeout: float = 30.0,
                     clock: Callable[[], float] = time.time) -> None:
    """A ``deleted=true`` record (live readers see it), then a tombstone (compaction forgets the name)."""
    record = connector_record(spec, False, int(clock() * 1000), deleted=True)
    produce_acknowledged(settings, [(spec.name, encode(RECORD, record)), (spec.name, None)], timeout,
                         topic=connectors_topic(settings))
