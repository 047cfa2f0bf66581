"""The CDC connector spec: which change stream feeds which model, and how.

It lives here, with the other contracts, because three layers read it: ``sie cdc run`` and the CDC stage
(``sie.connectors``), the control plane (``POST /v1/connectors`` validates it, the leader places it) and
the node agent (it runs a connector as a kind of replica).  ``sie.connectors.cdc.config`` re-exports it.

Example (YAML; snake_case or camelCase keys; optionally wrapped in
``kind: CdcConnector`` / ``metadata.name`` / ``spec``)::

    name: orders-to-fraud
    format: canal-json            # canal-json | debezium-json | maxwell-json
    source_topic: canal.shop.orders
    model: fraud-scorer           # requests go to sie.model.fraud-scorer.requests
    tables: ["shop.orders", "shop.refund_*"]   # fnmatch globs on "db.table"
    operations: [insert, update]  # default; add delete to score deletes (before image)
    mapping: {amount: amount, merchant: merchant_id}   # model input field -> column
    skip_unchanged_updates: true  # an UPDATE touching no mapped column is skipped
    decimal_scales: {shop.orders.amount: 2}   # Debezium precise decimals without schemas
    primary_keys: {shop.audit: [event_id]}    # when the events carry no pk
    id_template: "{db}.{table}:{pk}:{ref}:{op}"

Snapshot/bootstrap rows (Debezium ``r``, Maxwell ``bootstrap-insert``) are
converted whenever ``insert`` is selected, and their requests say ``op: read``.
A missing ``mapping`` means: the model's input fields by the same column
names when the model's schema is known to the converter, else every column.
"""

from __future__ import annotations

import re
import string
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic.alias_generators import to_camel
from pydantic_core import ErrorDetails

from sie.kernel.errors import SpecError

CdcFormat = Literal["canal-json", "debezium-json", "maxwell-json"]
Operation = Literal["insert", "update", "delete"]

ID_FIELDS = frozenset({"db", "table", "pk", "op", "ref", "position", "ts_ms", "connector"})
DEFAULT_ID_TEMPLATE = "{db}.{table}:{pk}:{ref}:{op}"
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$")


class ConnectorSpecError(SpecError):
    """An invalid CDC connector spec; the message lists each field path and reason."""


class CdcConnectorSpec(BaseModel):
    """A validated, frozen connector spec (see module docstring)."""

    model_config = ConfigDict(
        frozen=True, extra="forbid", strict=True, alias_generator=to_camel, populate_by_name=True
    )

    name: str
    format: CdcFormat
    source_topic: str = Field(min_length=1)
    model: str = Field(min_length=1)
    tables: list[str] = Field(min_length=1)
    operations: list[Operation] = Field(default_factory=lambda: list[Operation](["insert", "update"]))
    mapping: dict[str, str] | None = None
    skip_unchanged_updates: bool = True
    decimal_scales: dict[str, int] = Field(default_factory=dict)
    primary_keys: dict[str, list[str]] = Field(default_factory=dict)
    id_template: str = DEFAULT_ID_TEMPLATE
    tinyint1_as_bool: bool = True
    request_topic: str | None = None

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not _NAME_RE.fullmatch(v):
            raise ValueError("must be 1-200 characters of letters, digits, '.', '_' or '-'")
        return v

    @field_validator("tables")
    @classmethod
    def _tables(cls, v: list[str]) -> list[str]:
        for i, pattern in enumerate(v):
            if pattern.count(".") < 1 or pattern.startswith(".") or pattern.endswith("."):
                raise ValueError(f"[{i}] {pattern!r} must look like 'db.table' (globs allowed: 'shop.*')")
        return v

    @field_validator("operations")
    @classmethod
    def _operations(cls, v: list[str]) -> list[str]:
        if not v:
            raise ValueError("must list at least one of insert, update, delete")
        if len(set(v)) != len(v):
            raise ValueError(f"lists an operation twice: {list(v)}")
        return v

    @field_validator("mapping")
    @classmethod
    def _mapping(cls, v: dict[str, str] | None) -> dict[str, str] | None:
        if v is not None:
            if not v:
                raise ValueError("must map at least one model input field (or be omitted)")
            for field, column in v.items():
                if not field or not column:
                    raise ValueError(f"entry {field!r}: {column!r}: field and column names must be non-empty")
        return v

    @field_validator("decimal_scales")
    @classmethod
    def _scales(cls, v: dict[str, int]) -> dict[str, int]:
        for column, scale in v.items():
            if column.count(".") < 2:
                raise ValueError(f"key {column!r} must be 'db.table.column'")
            if not 0 <= scale <= 1000:  # PostgreSQL's maximum; MySQL's is 30
                raise ValueError(f"{column}: scale must be between 0 and 1000 (got {scale})")
        return v

    @field_validator("primary_keys")
    @classmethod
    def _pks(cls, v: dict[str, list[str]]) -> dict[str, list[str]]:
        for table, cols in v.items():
            if table.count(".") != 1:
                raise ValueError(f"key {table!r} must be 'db.table'")
            if not cols:
                raise ValueError(f"{table}: list at least one column")
        return v

    @field_validator("id_template")
    @classmethod
    def _id_template(cls, v: str) -> str:
        try:
            names = {f for _, f, _, _ in string.Formatter().parse(v) if f is not None}
        except ValueError as exc:
            raise ValueError(f"is not a valid format string ({exc})") from None
        unknown = names - ID_FIELDS
        if unknown:
            raise ValueError(f"unknown placeholders {sorted(unknown)}; allowed: {sorted(ID_FIELDS)}")
        if "pk" not in names or not names & {"ref", "position"}:
            raise ValueError("must contain {pk} and {ref} (or {position}) so ids are unique and replay-stable")
        return v

    @model_validator(mode="after")
    def _topics_differ(self) -> CdcConnectorSpec:
        if self.request_topic is not None and self.request_topic == self.source_topic:
            raise ValueError("request_topic must differ from source_topic (the connector would read its own output)")
        return self


def _path(loc: tuple[Any, ...], doc: dict[str, Any] | None = None) -> str:
    """``connector.<key as written>[i]...``: the top-level key in the spelling the document used."""
    out = "connector"
    for i, part in enumerate(loc):
        if i == 0 and doc is not None and isinstance(part, str) and part not in doc:
            written = [k for k in (_SNAKE.get(part), part) if k is not None and k in doc]
            part = written[0] if written else part
        out += f"[{part}]" if isinstance(part, int) else f".{part}"
    return out


#: camelCase alias -> snake_case field name (both spellings are accepted)
_SNAKE = {to_camel(name): name for name in CdcConnectorSpec.model_fields}
_KNOWN_KEYS = ", ".join(to_camel(name) for name in CdcConnectorSpec.model_fields)
_TYPE_WORDS = {"bool_type": "a boolean (true/false)", "string_type": "a string", "int_type": "an integer",
               "list_type": "a list", "dict_type": "a mapping"}


def _reason(err: ErrorDetails) -> str:
    """pydantic's error as the ModelService spec words it (``unknown key; known keys: ...``)."""
    kind = err["type"]
    if kind == "extra_forbidden":
        return f"unknown key; known keys: {_KNOWN_KEYS}"
    if kind == "missing":
        return "required"
    if kind == "literal_error":
        expected = str((err.get("ctx") or {}).get("expected", ""))
        return "must be one of " + expected.replace("'", "").replace(" or ", ", ")
    if kind in _TYPE_WORDS:
        return f"must be {_TYPE_WORDS[kind]}"
    if kind == "too_short":
        return "must not be empty"
    return str(err["msg"]).removeprefix("Value error, ").replace("Input should be", "must be")


def parse_connector_spec(doc: Any, source: str = "<dict>") -> CdcConnectorSpec:
    """Validate a document; raise ``ConnectorSpecError`` listing every field path and reason."""
    if not isinstance(doc, dict):
        raise ConnectorSpecError(f"{source}: a CDC connector spec must be a mapping, got {type(doc).__name__}")
    if doc.get("kind") is not None:
        if doc.get("kind") != "CdcConnector":
            raise ConnectorSpecError(f"{source}: kind must be CdcConnector (got {doc.get('kind')!r})")
        body = dict(doc.get("spec") or {})
        name = (doc.get("metadata") or {}).get("name")
        if name is not None:
            body.setdefault("name", name)
        doc = body
    try:
        return CdcConnectorSpec.model_validate(doc)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            got = err.get("input")
            shown = "" if err["type"] in ("missing", "extra_forbidden") or isinstance(got, dict) else f" (got {got!r})"
            problems.append(f"{_path(err['loc'], doc)}: {_reason(err)}{shown}")
        raise ConnectorSpecError(f"{source}: " + "; ".join(problems)) from None


def connector_name_problems(spec: CdcConnectorSpec, topic_prefix: str, request_topic: str | None = None) -> list[str]:
    """The connector's names under the naming module's rules (``sie.kernel.names``), one ``field: reason`` each: its
    target model's name, its request topic (the spec's, or ``request_topic``: what the control plane resolved)
    only outside ``<p>.`` or the target model's own, and a source that is no system topic.  Without it a connector
    could write requests into ``<p>.specs`` and ensure that topic as a data topic (``cleanup.policy=delete``)."""
    from sie.kernel.errors import ConfigError
    from sie.kernel.names import Names, check_model_name

    names = Names(topic_prefix)
    try:
        check_model_name(spec.model, "connector.model")
    except ConfigError as exc:
        return [str(exc)]
    problems = []
    for field, topic in (("connector.requestTopic", spec.request_topic), ("request_topic", request_topic)):
        problem = names.data_topic_problem(spec.model, topic) if topic is not None else None
        if problem:
            problems.append(f"{field}: {problem}")
    if names.is_system_topic(spec.source_topic):
        problems.append(f"connector.sourceTopic: {spec.source_topic} is SIE's system topic, not a change stream")
    return problems


#: ``kind`` of the document an agent gets for a connector replica (a ModelService document has no ``kind``)
CONNECTOR_KIND = "CdcConnector"


def connector_replica_doc(spec: CdcConnectorSpec, field_types: dict[str, str] | None,
                          request_topic: str | None) -> dict[str, Any]:
    """What the control plane assigns for a connector replica: the spec and what the stage needs of the
    target model (its input field types, its request topic), so the replica reads no other topic."""
    return {"kind": CONNECTOR_KIND, "connector": spec.model_dump(mode="json"), "field_types": field_types,
            "request_topic": request_topic}


def is_connector_doc(doc: Any) -> bool:
    return isinstance(doc, dict) and doc.get("kind") == CONNECTOR_KIND
