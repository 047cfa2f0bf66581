"""The ModelService spec: load a YAML file or a dict into the normalised, frozen ``ModelService``.

Two document styles are accepted as written in the SIE article
(``examples/article/``): the flat model-spec (``name``, ``backend: sglang``,
``min_gpu_memory_mb``, ``slas``) and the Kubernetes-style
``apiVersion: sie.lmsys.org/v1, kind: ModelService``.  ``docs/contracts.md``
lists every field of both.  ``load`` is the one way in::

    load(path or document, policy) -> YAML (bounded, no aliases) -> sie.schemas.spec_document (the shape, declared
    once: the CRD derives from it too) -> sie.schemas.spec_rules (what the shape cannot state) -> ModelService
    -> the node's SpecPolicy (when given)

Errors raise ``sie.kernel.errors.SpecError`` (subclass ``InvalidSpec``) listing every problem, one per line, as
``<field path>: <reason> (got <value>)``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, overload

import yaml

from sie.kernel.settings import Settings
from sie.schemas.spec_models import (
    BACKEND_TYPES,
    FIELD_TYPES,
    BackendSpec,
    FieldSpec,
    IOSchema,
    KafkaInput,
    ModelService,
    Resources,
    Scheduling,
    Sla,
    SpecTopics,
)
from sie.schemas.spec_rules import InvalidSpec, build_spec, parse_quantity

if TYPE_CHECKING:
    from sie.schemas.spec_policy import SpecPolicy

__all__ = [
    "BACKEND_TYPES",
    "FIELD_TYPES",
    "BackendSpec",
    "FieldSpec",
    "IOSchema",
    "InvalidSpec",
    "KafkaInput",
    "ModelService",
    "Resources",
    "Scheduling",
    "Sla",
    "SpecTopics",
    "load",
    "parse_quantity",
    "read_yaml_documents",
]


#: bounds checked before (size) and while (depth, nodes) a YAML text is composed, i.e. before anything expands
MAX_YAML_BYTES = 1 << 20
MAX_YAML_DEPTH = 64
MAX_YAML_NODES = 100_000


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys (PyYAML silently keeps the last one), aliases, and documents
    nested or sized beyond the bounds above.

    Aliases are refused at composition, before any node is built: a ~1 KB document of nested aliases
    ("billion laughs") would otherwise become a graph that expands to gigabytes as soon as the spec is
    serialised.  A spec never needs one (write the value out); anchors alone are harmless.
    """

    def __init__(self, stream: Any) -> None:
        super().__init__(stream)
        self._depth = 0
        self._nodes = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.composer.ComposerError(
                None, None, f"aliases are not allowed in a spec (*{event.anchor}); write the value out", event.start_mark)
        self._nodes += 1
        if self._nodes > MAX_YAML_NODES:
            raise yaml.composer.ComposerError(None, None, f"more than {MAX_YAML_NODES} YAML nodes", self.peek_event().start_mark)
        if self._depth >= MAX_YAML_DEPTH:
            raise yaml.composer.ComposerError(None, None, f"nested deeper than {MAX_YAML_DEPTH} levels",
                                              self.peek_event().start_mark)
        self._depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def _construct_mapping(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    seen: dict[Any, int] = {}
    for key_node, _ in node.value:
        if not isinstance(key_node, yaml.ScalarNode):  # `? - a` / `? {a: 1}`: a list or mapping as a key
            raise yaml.constructor.ConstructorError(
                None, None, "a key must be a plain name, not a list or a mapping (a `?` before a list item?)",
                key_node.start_mark)
        key = loader.construct_object(key_node, deep=deep)
        line = key_node.start_mark.line + 1
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r} (first at line {seen[key]})", key_node.start_mark
            )
        seen[key] = line
    return loader.construct_mapping(node, deep=deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def read_yaml_documents(text: str, source: str) -> list[Any]:
    """Every YAML document in ``text``; a syntax error becomes an InvalidSpec naming the line.

    The size bound is checked before parsing; aliases, depth and node count while composing (see
    ``_StrictLoader``): a hostile document is refused in microseconds, with memory bounded by its size.
    """
    size = len(text.encode("utf-8", "surrogatepass")) if len(text) * 4 > MAX_YAML_BYTES else len(text)
    if size > MAX_YAML_BYTES:
        raise InvalidSpec(source, [f"yaml: {size} bytes, more than {MAX_YAML_BYTES}; a spec is a small document"])
    try:
        return [d for d in yaml.load_all(text, Loader=_StrictLoader) if d is not None]
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark is not None else "unknown position"
        problem = getattr(exc, "problem", None) or str(exc)
        raise InvalidSpec(source, [f"yaml ({where}): {problem}"]) from None


@overload
def load(source: str | Path | Mapping[str, Any], policy: SpecPolicy | Settings | None = None, *,
         many: Literal[False] = False, topic_prefix: str | None = None, origin: str | None = None,
         base_dir: Path | None = None) -> ModelService: ...
@overload
def load(source: str | Path | Mapping[str, Any], policy: SpecPolicy | Settings | None = None, *,
         many: Literal[True], topic_prefix: str | None = None, origin: str | None = None,
         base_dir: Path | None = None) -> list[ModelService]: ...
def load(source: str | Path | Mapping[str, Any], policy: SpecPolicy | Settings | None = None, *, many: bool = False,
         topic_prefix: str | None = None, origin: str | None = None,
         base_dir: Path | None = None) -> ModelService | list[ModelService]:
    """THE way to read a ModelService: a YAML file (a path) or a parsed document (a mapping).

    ``policy``: this node's rules (``SpecPolicy``, or ``Settings`` to build it from); None = the document
    alone (a spec read back from the cluster, or one this machine will not run).  A file's own folder
    counts as a model root for the policy (an artifact next to the spec you apply is yours).  ``many``:
    every document of a ``---``-separated file, else exactly one.  ``topic_prefix``: the default model
    topics and group (the policy's prefix when it has one, else ``sie``).  ``origin``: the name problems
    are reported under (a mapping's default ``<dict>``); ``base_dir``: where a mapping's relative artifact
    paths resolve (a file's own folder otherwise).  Every problem is raised together as one ``InvalidSpec``.
    """
    from sie.schemas.spec_policy import SpecPolicy, _real

    if isinstance(policy, Settings):
        policy = SpecPolicy.from_settings(policy)
    prefix = topic_prefix if topic_prefix is not None else policy.topic_prefix if policy is not None else "sie"
    if not isinstance(source, (str, Path)):  # a document (build_spec names anything but a mapping)
        where = origin or "<dict>"
        specs = [build_spec(source, source=where, base_dir=base_dir, topic_prefix=prefix)]
    else:
        path = Path(source)
        where = origin or str(path)
        specs = _read_file(path, where, prefix)
        if policy is not None:
            policy = replace(policy, model_roots=(*policy.model_roots, _real(path.resolve().parent)))
    if policy is not None:
        problems = [p for spec in specs for p in ([f"[{spec.name}] {q}" for q in policy.check(spec)]
                                                  if len(specs) > 1 else policy.check(spec))]
        if problems:
            raise InvalidSpec(where, problems)
    if many:
        return specs
    if len(specs) != 1:
        raise InvalidSpec(where, [f"document: expected one ModelService, found {len(specs)}; load it with many=True"])
    return specs[0]


def _read_file(path: Path, where: str, topic_prefix: str) -> list[ModelService]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise InvalidSpec(where, [f"file: cannot read {path}: {exc.strerror or exc}"]) from None
    docs = read_yaml_documents(text, where)
    if not docs:
        raise InvalidSpec(where, ["document: the file holds no YAML document"])
    specs = []
    problems: list[str] = []
    for i, doc in enumerate(docs):
        source = where if len(docs) == 1 else f"{where}#{i + 1}"
        try:
            specs.append(build_spec(doc, source=source, base_dir=path.resolve().parent, topic_prefix=topic_prefix))
        except InvalidSpec as exc:
            problems.extend(exc.problems if len(docs) == 1 else [f"[document {i + 1}] {p}" for p in exc.problems])
    if problems:
        raise InvalidSpec(where, problems)
    return specs

