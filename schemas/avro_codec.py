"""Avro encoding of SIE's system records (namespace ``sie.v1``), single-object wire format.

Every value on a system topic is ``C3 01`` + the 8-byte little-endian
CRC-64-AVRO fingerprint of the writer schema's canonical form + the
schemaless Avro body.  The fingerprint lets a reader find the exact schema a
record was written with (the current one, or an older one kept under
``schemas/avro/history/``) and resolve it against its current reader schema,
so agents and control planes of different versions can share topics during a
rolling upgrade.  Evolution rules: ``docs/contracts.md``.

``python -m sie.schemas.avro_codec --freeze`` saves each current schema whose
fingerprint is not yet in ``history/`` (run it when a schema changes;
``tests/test_avro.py`` fails until you do).
"""

from __future__ import annotations

import io
import json
import sys
from functools import lru_cache
from pathlib import Path
from typing import Any, cast

from fastavro import parse_schema, schemaless_reader, schemaless_writer
from fastavro.read import SchemaResolutionError
from fastavro.schema import to_parsing_canonical_form

from sie.kernel.errors import SieError

AVRO_DIR = Path(__file__).resolve().parent / "avro"
HISTORY_DIR = AVRO_DIR / "history"
NAMESPACE = "sie.v1"
MAGIC = b"\xc3\x01"
HEADER_LEN = 10
# Named types shared by records, in dependency order.
SHARED_TYPES = ("ReplicaState", "GpuInfo", "ReplicaReport", "ReplicaAssignment")
# Top-level records: one per system topic value.
RECORDS = (
    "ModelSpecRecord",
    "NodeRegistration",
    "Heartbeat",
    "Assignment",
    "ReplicaStatus",
    "ControlEvent",
    "LeaderEpoch",
    "ModelStatus",
    "ArtifactManifest",
    "ConnectorRecord",
    "Rollout",
)


class AvroCodecError(SieError):
    """A record could not be encoded or decoded; the message names the record and the cause."""


# ---------------------------------------------------------------- fingerprints

_CRC64_EMPTY = 0xC15D213AA4D7A795


def _crc64_table() -> list[int]:
    table = []
    for i in range(256):
        fp = i
        for _ in range(8):
            fp = (fp >> 1) ^ (_CRC64_EMPTY & -(fp & 1))
        table.append(fp)
    return table


_CRC64_TABLE = _crc64_table()


def crc64_avro(data: bytes) -> bytes:
    """The Avro spec's 64-bit Rabin fingerprint, as the 8 little-endian bytes the wire format uses."""
    fp = _CRC64_EMPTY
    for byte in data:
        fp = (fp >> 8) ^ _CRC64_TABLE[(fp ^ byte) & 0xFF]
    return fp.to_bytes(8, "little")


def fingerprint(expanded_schema: dict) -> bytes:
    return crc64_avro(to_parsing_canonical_form(expanded_schema).encode("utf-8"))


# ---------------------------------------------------------------- schema loading


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise AvroCodecError(f"{path}: unreadable Avro schema: {exc}") from None


def _inline(schema: Any, named: dict[str, Any], defined: set[str]) -> Any:
    """Replace references to shared named types by their definition (first use only, as Avro requires)."""
    if isinstance(schema, str):
        full = schema if "." in schema else f"{NAMESPACE}.{schema}"
        if full in named and full not in defined:
            defined.add(full)
            return _inline(named[full], named, defined)
        return schema
    if isinstance(schema, list):
        return [_inline(s, named, defined) for s in schema]
    if isinstance(schema, dict):
        out = dict(schema)
        if out.get("type") in ("record", "enum", "fixed") and "name" in out:
            defined.add(f"{out.get('namespace', NAMESPACE)}.{out['name']}")
        if out.get("type") == "record":
            out["fields"] = [{**f, "type": _inline(f["type"], named, defined)} for f in out["fields"]]
        elif out.get("type") == "array":
            out["items"] = _inline(out["items"], named, defined)
        elif out.get("type") == "map":
            out["values"] = _inline(out["values"], named, defined)
        elif isinstance(out.get("type"), (dict, list)):
            out["type"] = _inline(out["type"], named, defined)
        return out
    return schema


def _full_name(schema: dict) -> str:
    return f"{schema.get('namespace', NAMESPACE)}.{schema['name']}"


class Codec:
    """Current reader schemas plus every known writer schema, by fingerprint."""

    def __init__(self, schema_dir: Path = AVRO_DIR, history_dir: Path | None = HISTORY_DIR) -> None:
        shared = {f"{NAMESPACE}.{n}": _read_json(schema_dir / f"{n}.avsc") for n in SHARED_TYPES}
        self._expanded: dict[str, dict] = {}
        self._parsed: dict[str, Any] = {}
        self._fingerprints: dict[str, bytes] = {}
        # fingerprint -> (short record name, parsed writer schema)
        self._writers: dict[bytes, tuple[str, Any]] = {}
        for name in RECORDS:
            expanded = _inline(_read_json(schema_dir / f"{name}.avsc"), shared, set())
            fp = fingerprint(expanded)
            parsed = parse_schema(expanded, _write_hint=True)
            self._expanded[name] = expanded
            self._parsed[name] = parsed
            self._fingerprints[name] = fp
            self._writers[fp] = (name, parsed)
        self.history: dict[bytes, tuple[str, Path]] = {}
        if history_dir is not None and history_dir.is_dir():
            for path in sorted(history_dir.glob("*.avsc")):
                self.register_writer(_read_json(path), path)

    def register_writer(self, expanded_schema: dict, origin: Path | None = None) -> bytes:
        """Accept records written with an older (self-contained) schema of a known record."""
        name = _full_name(expanded_schema).rsplit(".", 1)[-1]
        if name not in self._parsed:
            raise AvroCodecError(f"{origin or 'schema'}: {_full_name(expanded_schema)} is not an SIE record ({', '.join(RECORDS)})")
        fp = fingerprint(expanded_schema)
        if fp not in self._writers:
            self._writers[fp] = (name, parse_schema(expanded_schema, _write_hint=True))
        self.history[fp] = (name, origin or Path("<registered>"))
        return fp

    def schema(self, name: str) -> dict:
        """The current, self-contained (shared types inlined) schema of a record."""
        return self._expanded[self._check_name(name)]

    def fingerprint(self, name: str) -> bytes:
        return self._fingerprints[self._check_name(name)]

    def _check_name(self, name: str) -> str:
        short = name.rsplit(".", 1)[-1]
        if short not in self._parsed:
            raise AvroCodecError(f"unknown record {name!r}; known: {', '.join(RECORDS)}")
        return short

    def encode(self, name: str, record: dict) -> bytes:
        short = self._check_name(name)
        buf = io.BytesIO()
        buf.write(MAGIC)
        buf.write(self._fingerprints[short])
        try:
            schemaless_writer(buf, self._parsed[short], record)
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise AvroCodecError(f"cannot encode {short}: {exc} (record keys: {sorted(record) if isinstance(record, dict) else type(record).__name__})") from None
        return buf.getvalue()

    def decode(self, data: bytes, expected: str | None = None) -> dict:
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise AvroCodecError(f"cannot decode {type(data).__name__}: expected bytes")
        data = bytes(data)
        if len(data) < HEADER_LEN or data[:2] != MAGIC:
            raise AvroCodecError(
                f"not an SIE Avro record: expected the single-object header C3 01 + 8-byte fingerprint "
                f"(got {data[:HEADER_LEN].hex(' ') or 'empty'}, {len(data)} bytes)"
            )
        fp = data[2:HEADER_LEN]
        known = self._writers.get(fp)
        if known is None:
            raise AvroCodecError(
                f"unknown writer schema fingerprint {fp.hex()}: written by a newer or foreign producer; "
                f"upgrade SIE or add that schema to {HISTORY_DIR}"
            )
        name, writer = known
        if expected is not None and self._check_name(expected) != name:
            raise AvroCodecError(f"expected a {expected.rsplit('.', 1)[-1]} record, got {name}")
        reader = self._parsed[name]
        buf = io.BytesIO(data)
        buf.seek(HEADER_LEN)
        try:
            record = schemaless_reader(buf, writer, None if writer is reader else reader)
        except SchemaResolutionError as exc:
            raise AvroCodecError(
                f"cannot read this {name} (writer fingerprint {fp.hex()}) with the current schema: {exc}; "
                "the change broke the evolution rules in docs/contracts.md"
            ) from None
        except Exception as exc:  # fastavro raises EOFError, ValueError, IndexError, UnicodeDecodeError ...
            raise AvroCodecError(f"corrupt {name} record ({len(data)} bytes): {type(exc).__name__}: {exc}") from None
        if buf.tell() != len(data):
            raise AvroCodecError(f"corrupt {name} record: {len(data) - buf.tell()} trailing bytes after the body")
        return cast(dict[str, Any], record)  # every SIE schema is a record, which fastavro reads as a dict

    def record_name(self, data: bytes) -> str | None:
        """The record a payload claims to be (None if the header is not SIE's or the fingerprint unknown)."""
        if len(data) < HEADER_LEN or data[:2] != MAGIC:
            return None
        known = self._writers.get(bytes(data[2:HEADER_LEN]))
        return known[0] if known else None

    def unfrozen(self, history_dir: Path = HISTORY_DIR) -> list[str]:
        """Records whose current schema is not saved under ``history_dir`` yet."""
        saved = {fingerprint(_read_json(p)) for p in history_dir.glob("*.avsc")} if history_dir.is_dir() else set()
        return [n for n in RECORDS if self._fingerprints[n] not in saved]

    def freeze(self, history_dir: Path = HISTORY_DIR) -> list[Path]:
        """Save every current schema that history lacks as ``<Name>.v<N>.avsc``."""
        history_dir.mkdir(parents=True, exist_ok=True)
        written = []
        for name in self.unfrozen(history_dir):
            n = len(list(history_dir.glob(f"{name}.v*.avsc"))) + 1
            path = history_dir / f"{name}.v{n}.avsc"
            path.write_text(json.dumps(self._expanded[name], indent=2) + "\n", encoding="utf-8")
            written.append(path)
        return written


@lru_cache(maxsize=1)
def default_codec() -> Codec:
    return Codec()


def encode(record_name: str, record: dict) -> bytes:
    """Single-object Avro bytes of ``record`` with the current schema of ``record_name`` (e.g. ``"Heartbeat"``)."""
    return default_codec().encode(record_name, record)


def decode(data: bytes, expected: str | None = None) -> dict:
    """Decode any known writer version into the current reader schema; ``expected`` checks the record type."""
    return default_codec().decode(data, expected)


def schema(name: str) -> dict:
    """The current self-contained schema of a record."""
    return default_codec().schema(name)


def _main(argv: list[str]) -> int:
    codec = Codec()
    if argv == ["--freeze"]:
        for path in codec.freeze():
            print(f"saved {path}")
        return 0
    if argv == ["--check"]:
        missing = codec.unfrozen()
        for name in missing:
            print(f"{name}: current schema not in {HISTORY_DIR}; run python -m sie.schemas.avro_codec --freeze")
        return 1 if missing else 0
    print("usage: python -m sie.schemas.avro_codec --freeze | --check", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
