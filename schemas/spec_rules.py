"""From a ModelService document to the normalised ``ModelService``: the rules the document's shape cannot state.

The shape (types, bounds, patterns, enums, unknown keys, both spellings) is declared once in
``sie.schemas.spec_document`` and checked by pydantic; this module adds what needs more than the shape::

    document --(spec_document.document_problems)--> shape problems (as written: flat or Kubernetes paths)
             --(each section validated on its own)--> the rules of that section
                 backend: the keys its type uses, the artifact (a path on this machine, a URI + sha256, a ref),
                          modules, callable/moduleClass as files, the backend's config (sie.schemas.backend_config)
                 resources: Kubernetes limits/requests as quantities; sla: min <= max replicas
                 io schemas: max_length only on strings, range only on numbers and ordered, names unique
                 topics, kafka_input, identity (name, version, metadata.name), owner annotation, rollout policy
             --(the whole document)--> sglang GPUs and memory, topics and group, exampleInput against inputSchema
    every problem -> one line ``<field path>: <reason> (got <value>)``, all raised together as ``InvalidSpec``
    what SIE accepts but cannot honour (image, tolerations, probes, foreign bootstrap servers) -> named warnings

| failure | result |
|---|---|
| the document is not a mapping, or another kind | one problem, nothing else is read |
| any problem in any section | ``InvalidSpec`` listing every problem found |
| an invariant of the normalised model the rules missed | ``InvalidSpec`` naming the model's field |
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from sie.kernel.errors import ConfigError, SpecError
from sie.kernel.names import ModelTopics, Names, path_problem
from sie.schemas.spec_document import (
    API_VERSION,
    KIND,
    NAME_RE,
    OWNER_ANNOTATION,
    TOPIC_RE,
    TYPE_ALIASES,
    VERSION_RE,
    BackendDocument,
    FieldDocument,
    IOSchemaDocument,
    KafkaInputDocument,
    ResourcesDocument,
    SchedulingDocument,
    SlaDocument,
    SpecDocument,
    TopicsDocument,
    document_problems,
    spellings_of,
)
from sie.schemas.spec_models import (
    SHA256_RE,
    ArtifactRef,
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

#: ``scheme://...``: an artifact given as a URI rather than a path on this machine (a drive letter is no scheme)
URI_RE = re.compile(r"^[a-z][a-z0-9+.-]+://")
_SHA256 = re.compile(SHA256_RE)
SUFFIX_FORMATS = {".pt": "torchscript", ".ts": "torchscript", ".pt2": "export", ".safetensors": "safetensors"}
DEFAULT_SGLANG_GPU_MEMORY_MB = 16384
_MISSING: Any = object()


class InvalidSpec(SpecError):
    """A spec with one or more problems; ``problems`` holds one line per problem."""

    def __init__(self, source: str, problems: list[str]) -> None:
        self.source = source
        self.problems = tuple(problems)
        n = len(problems)
        header = f"{source}: invalid ModelService spec ({n} problem{'s' if n != 1 else ''})"
        super().__init__("\n".join([header, *problems]))


def _got(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


class _Issues:
    """Problems and warnings, in the order the document is read."""

    def __init__(self) -> None:
        self.errors: list[str] = []
        self.warnings: list[str] = []

    def error(self, path: str, reason: str, value: Any = _MISSING) -> None:
        line = f"{path}: {reason}" + ("" if value is _MISSING else f" (got {_got(value)})")
        if line not in self.errors:
            self.errors.append(line)

    def warn(self, path: str, reason: str) -> None:
        self.warnings.append(f"{path}: {reason}")


class _Where:
    """One section of the document: its raw mapping, where it is written, and the spelling of each key."""

    def __init__(self, raw: Any, path: str) -> None:
        self.raw: dict[str, Any] = raw if isinstance(raw, dict) else {}
        self.path = path

    def key(self, model: type[BaseModel], name: str) -> str:
        """The spelling the document used for field ``name`` (the first declared one when absent)."""
        spellings = spellings_of(model, name)
        return next((s for s in spellings if s in self.raw), spellings[0])

    def at(self, model: type[BaseModel], name: str) -> str:
        key = self.key(model, name)
        return f"{self.path}.{key}" if self.path else key

    def value(self, model: type[BaseModel], name: str) -> Any:
        key = self.key(model, name)
        return self.raw[key] if key in self.raw else _MISSING

    def child(self, model: type[BaseModel], name: str) -> _Where:
        return _Where(self.value(model, name), self.at(model, name))


def _valid(model: type[BaseModel], raw: Any) -> Any:
    """``raw`` as ``model`` when its shape is right but for unknown keys (``document_problems`` reports those and
    every other shape problem), else None: a typo in one key does not hide the problems of the others."""
    data = raw if raw is not _MISSING and raw is not None else {}
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        unknown = {e["loc"][0] for e in exc.errors() if e["type"] == "extra_forbidden" and len(e["loc"]) == 1}
        if not unknown or not isinstance(data, dict):
            return None
    try:
        return model.model_validate({k: v for k, v in data.items() if k not in unknown})
    except ValidationError:
        return None


def _text(issues: _Issues, path: str, value: Any) -> str | None:
    """A string the document gave (None: absent); an empty one is a problem."""
    if value is _MISSING or value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        issues.error(path, "must be a non-empty string", value)
        return None
    return value


_QUANTITY_RE = re.compile(r"^([0-9]+(?:\.[0-9]+)?(?:[eE][0-9]+)?)(Ki|Mi|Gi|Ti|Pi|Ei|k|K|M|G|T|P|E|m)?$")
_QUANTITY_FACTORS = {
    None: 1, "m": 1e-3, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18,
    "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60,
}


def parse_quantity(value: Any) -> float:
    """A Kubernetes resource quantity as a plain number (``"32Gi"`` -> 34359738368, ``"500m"`` -> 0.5)."""
    if isinstance(value, bool):
        raise ValueError("not a quantity")
    if isinstance(value, (int, float)):
        try:
            q = float(value)
        except OverflowError:  # an integer beyond 1.8e308
            q = math.inf
    else:
        match = _QUANTITY_RE.fullmatch(str(value).strip())
        if not match:
            raise ValueError("not a Kubernetes quantity (e.g. 32Gi, 512Mi, 500m, 2)")
        q = float(match.group(1)) * _QUANTITY_FACTORS[match.group(2)]
    if not math.isfinite(q):  # '9' * 400, 1e400, .inf, .nan: no resource is that large
        raise ValueError("not a finite quantity (too large, or NaN)")
    return q


# ---------------------------------------------------------------- sections


def _io_schema(issues: _Issues, spec: _Where, name: str, what: str) -> IOSchema:
    where = spec.child(SpecDocument, name)
    if spec.value(SpecDocument, name) in (_MISSING, None):
        issues.warn(where.path, f"absent; {what} are not validated (every field passes through)")
        return IOSchema(fields=(), unknown_fields="allow")
    raw_fields = where.value(IOSchemaDocument, "fields")
    raw_fields = raw_fields if isinstance(raw_fields, list) else []
    doc = _valid(IOSchemaDocument, {**where.raw, "fields": []}) if isinstance(spec.value(SpecDocument, name), dict) else None
    if doc is None:
        return IOSchema()
    fields_path = where.at(IOSchemaDocument, "fields")
    out: list[FieldSpec] = []
    seen: dict[str, int] = {}
    for i, raw_field in enumerate(raw_fields):  # each field on its own: one bad field hides no other's problems
        item = _Where(raw_field, f"{fields_path}[{i}]")
        f = _valid(FieldDocument, raw_field) if isinstance(raw_field, dict) else None
        if f is None:
            continue
        ftype = TYPE_ALIASES[f.type]
        ok = True
        if f.max_length is not None and ftype != "string":
            issues.error(item.at(FieldDocument, "max_length"),
                         f"only string fields take max_length (field type is {ftype})", f.max_length)
        bounds = None
        if f.range is not None:
            raw_range = item.value(FieldDocument, "range")
            if ftype not in ("int", "float"):
                issues.error(item.at(FieldDocument, "range"), f"only int/float fields take a range (field type is {ftype})",
                             raw_range)
            elif not all(math.isfinite(x) for x in f.range):
                issues.error(item.at(FieldDocument, "range"), "must be [min, max] with two finite numbers", raw_range)
            elif f.range[0] > f.range[1]:
                issues.error(item.at(FieldDocument, "range"), f"min {raw_range[0]} > max {raw_range[1]}", raw_range)
            else:
                bounds = (float(f.range[0]), float(f.range[1]))
        if f.name in seen:
            issues.error(f"{fields_path}[{i}].name", f"duplicate field name (also {fields_path}[{seen[f.name]}])", f.name)
            ok = False
        else:
            seen[f.name] = i
        if ok:
            description = item.value(FieldDocument, "description")
            out.append(FieldSpec(name=f.name, type=ftype, required=f.required, nullable=f.nullable,
                                 max_length=f.max_length if ftype == "string" else None, range=bounds,
                                 description=None if description in (_MISSING, None) else str(description)))
    return IOSchema(fields=tuple(out), unknown_fields=doc.unknown_fields)


def _module_path_problem(reference: str) -> str | None:
    """Why the module of ``package.module:name`` cannot be a file (``sie apply`` looks for ``package/module.py``
    next to the spec), or None: the module's path is checked like any path from data."""
    module = reference.partition(":")[0]
    problem = path_problem(module.replace(".", "/") + ".py")
    return None if problem is None else f"module {problem}"


def _ref(issues: _Issues, path: str, value: Any, default_name: str, sha256: Any = _MISSING) -> ArtifactRef | None:
    """An artifact named by content: ``{sha256, name, size, uri}`` (on the cluster's artifacts topic unless
    ``uri`` says where), or a URI string with ``sha256`` given next to it."""
    if isinstance(value, str):
        name = value.rstrip("/").rsplit("/", 1)[-1].split("?", 1)[0] or default_name
        value = {"uri": value, "name": name, **({} if sha256 is _MISSING else {"sha256": sha256})}
    elif not isinstance(value, dict):
        issues.error(path, "must be a mapping {sha256, name, size, uri} or a URI", value)
        return None
    known = ("sha256", "name", "size", "uri")
    for key in value:
        if key not in known:
            issues.error(f"{path}.{key}", f"unknown key; known keys: {', '.join(sorted(known))}")
    digest, name, size, uri = (value.get(k) for k in known)
    if digest is None:
        issues.error(f"{path}.sha256", "required: the sha256 (64 hex digits) every node checks the downloaded bytes against")
        return None
    if not isinstance(digest, str) or not _SHA256.fullmatch(digest.lower()):
        issues.error(f"{path}.sha256", "must be 64 hex digits (sha256sum FILE)", digest)
        return None
    fields: dict[str, Any] = {"sha256": digest.lower(), "name": default_name}
    if name is not None:
        fields["name"] = name
    if size is not None:
        if type(size) is not int:
            issues.error(f"{path}.size", "must be an integer", size)
        elif size < 0:
            issues.error(f"{path}.size", "must be >= 0", size)
        else:
            fields["size"] = size
    if uri is not None:
        if not isinstance(uri, str) or not URI_RE.match(uri):
            issues.error(f"{path}.uri", "must be a URI (file://, https://, s3://, ...)", uri)
            return None
        fields["uri"] = uri
    try:
        return ArtifactRef(**fields)
    except ValidationError as exc:
        for e in exc.errors():
            field = ".".join(map(str, e["loc"]))
            issues.error(f"{path}.{field}" if field else path, e["msg"], e.get("input"))
        return None


def _torch(issues: _Issues, out: dict[str, Any], b: _Where, doc: BackendDocument, base_dir: Path | None) -> None:
    art_path, artifact = b.at(BackendDocument, "artifact"), b.value(BackendDocument, "artifact")
    sha_path, sha256 = b.at(BackendDocument, "sha256"), b.value(BackendDocument, "sha256")
    mc_path = b.at(BackendDocument, "module_class")
    if artifact is _MISSING or artifact is None:
        issues.error(art_path, "required for the torch backend (a .pt/.ts TorchScript, .pt2 export or .safetensors "
                               "file: a path, a URI with sha256, or {sha256, name} uploaded by sie apply)")
        return
    if isinstance(artifact, dict) or (isinstance(artifact, str) and URI_RE.match(artifact)):
        if isinstance(artifact, str) and sha256 is _MISSING:
            issues.error(sha_path, f"required with an artifact URI: every node checks the download against it "
                                   f"(sha256sum the file; got artifact {_got(artifact)})")
            return
        if isinstance(artifact, dict) and sha256 is not _MISSING:
            issues.error(sha_path, f"give the digest once, in {art_path}.sha256", sha256)
        ref = _ref(issues, art_path, artifact, default_name="artifact", sha256=sha256)
        if ref is None:
            return
        out["artifact_ref"] = ref
        name = Path(ref.name)
    else:
        if not isinstance(artifact, str) or not artifact.strip():
            issues.error(art_path, "must be a file path", artifact)
            return
        problem = path_problem(artifact)
        if problem is not None:
            issues.error(art_path, problem, artifact)
            return
        path = Path(artifact).expanduser()
        if not path.is_absolute():
            if base_dir is None:
                issues.error(art_path, "a relative path needs a spec file to resolve it against, and there is none "
                                       "here: apply the file with `sie apply -f` (it uploads the artifact), or give "
                                       "{sha256, name} of an uploaded artifact (PUT /v1/artifacts/sha256:<hex>) or a "
                                       "URI with sha256", artifact)
                return
            path = (base_dir / path).resolve()
        problem = path_problem(str(path))
        if problem is not None:  # the spec file's own folder plus the name: still within the limits?
            issues.error(art_path, f"{path} {problem}", artifact)
            return
        if not path.is_file():
            issues.error(art_path, f"file not found: {path} (paths are relative to the spec file)", artifact)
        elif sha256 is not _MISSING:
            from sie.schemas.artifact_cache import file_sha256

            actual = file_sha256(path)
            if actual != str(sha256).lower():
                issues.error(sha_path, f"{path} has sha256 {actual}; the spec expects another file", sha256)
        out["artifact"] = path
        name = path
    fmt: str | None = doc.format
    if fmt is None:
        fmt = SUFFIX_FORMATS.get(name.suffix.lower())
        if fmt is None:
            issues.error(art_path, f"cannot infer the format from suffix {name.suffix!r}; set format: "
                                   "torchscript|export|safetensors", str(name))
    out["format"] = fmt
    if doc.module_class:
        if (problem := _module_path_problem(doc.module_class)) is not None:
            issues.error(mc_path, problem, doc.module_class)
        else:
            out["module_class"] = doc.module_class
    if fmt == "safetensors" and not doc.module_class:
        issues.error(mc_path, "required with a safetensors artifact (the nn.Module to load the weights into)")


def _backend(issues: _Issues, b: _Where, base_dir: Path | None) -> dict[str, Any] | None:
    doc = _valid(BackendDocument, b.raw)
    if doc is None:
        return None
    btype = doc.type
    out: dict[str, Any] = {"type": btype}
    if b.value(BackendDocument, "config") not in (_MISSING, None):
        out["config"] = dict(doc.config)
        _check_backend_config(issues, b.at(BackendDocument, "config"), btype, doc.config)
    if b.value(BackendDocument, "module_kwargs") not in (_MISSING, None):
        out["module_kwargs"] = dict(doc.module_kwargs)
    if b.value(BackendDocument, "device") is not _MISSING:
        out["device"] = doc.device
    foreign = {"torch": ("callable", "model_path"),
               "python": ("artifact", "sha256", "format", "module_class", "model_path"),
               "sglang": ("artifact", "sha256", "modules", "format", "module_class", "callable")}[btype]
    for name in foreign:
        if b.value(BackendDocument, name) is not _MISSING:
            issues.error(b.at(BackendDocument, name), f"not used by the {btype} backend", b.value(BackendDocument, name))
    modules = b.value(BackendDocument, "modules")
    if modules is not _MISSING and modules is not None and btype != "sglang":
        ref = _ref(issues, b.at(BackendDocument, "modules"), modules, default_name="modules.zip")
        if ref is not None:
            out["modules"] = ref
    if btype == "torch":
        _torch(issues, out, b, doc, base_dir)
    elif btype == "python":
        call_path = b.at(BackendDocument, "callable")
        if not doc.callable:
            issues.error(call_path, "required for the python backend ('package.module:function')")
        elif (problem := _module_path_problem(doc.callable)) is not None:
            issues.error(call_path, problem, doc.callable)
        else:
            out["callable"] = doc.callable
    else:
        mp_path, model_path = b.at(BackendDocument, "model_path"), b.value(BackendDocument, "model_path")
        mp = _text(issues, mp_path, model_path)
        if mp is None and model_path is _MISSING:
            issues.warn(mp_path, "not given; the node agent resolves the model by name from its local model directory")
        out["model_path"] = mp
    return out


def _check_backend_config(issues: _Issues, path: str, btype: str, config: dict[str, Any]) -> None:
    """Every key of ``config`` known to ``btype``'s backend, of its type (``sie.schemas.backend_config``)."""
    from sie.schemas.backend_config import IGNORED, check_backend_config

    for where, reason in check_backend_config(btype, config):
        issues.error(f"{path}.{where}" if where else path, reason)
    for key, why in IGNORED.items():
        if btype == "sglang" and config.get(key) is not None:
            issues.warn(f"{path}.{key}", why)
    if btype == "sglang" and "mem_fraction_static" in config:
        issues.warn(
            f"{path}.mem_fraction_static",
            "ignored on a GPU NVML can measure; the agent computes it from resources.gpuMemoryMb and the GPU's free "
            "memory at launch",
        )


def _sla(issues: _Issues, s: _Where) -> dict[str, Any]:
    doc = _valid(SlaDocument, s.raw)
    if doc is None:
        return {}
    lo = doc.min_replicas
    hi = doc.max_replicas if s.value(SlaDocument, "max_replicas") not in (_MISSING, None) else max(lo, 1)
    if lo > hi:
        issues.error(s.at(SlaDocument, "min_replicas"), f"must be <= max_replicas {hi}", lo)
        lo = hi
    return {"p99_latency_ms": doc.p99_latency_ms, "max_queue_time_ms": doc.max_queue_time_ms,
            "min_qps": doc.min_qps, "min_replicas": lo, "max_replicas": hi}


def _resources(issues: _Issues, r: _Where) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kind in ("limits", "requests"):
        sub = r.child(ResourcesDocument, kind)
        for key, value in sub.raw.items():
            path = f"{sub.path}.{key}"
            if key == "nvidia.com/gpu":
                if value is None:
                    continue
                if type(value) is not int:
                    issues.error(path, "must be an integer", value)
                elif value < 0:
                    issues.error(path, "must be >= 0", value)
                else:
                    out.setdefault("gpus", value)
            elif key in ("memory", "cpu"):
                try:
                    q = parse_quantity(value)
                except ValueError as exc:
                    issues.error(path, str(exc), value)
                    continue
                if q < 0:
                    issues.error(path, "must be >= 0", value)
                    continue
                if key == "memory":
                    out.setdefault("memory_mb", int(math.ceil(q / 2**20)))
                else:
                    out.setdefault("cpu", q)
            else:
                issues.warn(path, "not a resource SIE schedules (nvidia.com/gpu, memory, cpu); ignored")
    doc = _valid(ResourcesDocument, {k: v for k, v in r.raw.items() if k not in ("limits", "requests")})
    if doc is not None:
        for name in ("gpu_memory_mb", "gpus", "cpu", "memory_mb"):
            if r.value(ResourcesDocument, name) not in (_MISSING, None):
                out[name] = getattr(doc, name)
    return out


def _scheduling(issues: _Issues, s: _Where) -> dict[str, Any]:
    doc = _valid(SchedulingDocument, s.raw)
    tolerations = s.value(SchedulingDocument, "tolerations")
    if tolerations is not _MISSING and tolerations:
        issues.warn(s.at(SchedulingDocument, "tolerations"),
                    "tolerations are a Kubernetes taint concept; outside Kubernetes SIE places by nodeSelector and tier only")
    tier = _text(issues, s.at(SchedulingDocument, "tier"), s.value(SchedulingDocument, "tier"))
    return {"node_selector": dict(doc.node_selector) if doc is not None else {}, "tier": tier}


def _topics(issues: _Issues, t: _Where) -> dict[str, str]:
    out: dict[str, str] = {}
    if _valid(TopicsDocument, t.raw) is None:
        return out
    for name in ("requests", "results", "dead_letters", "backfill"):
        path, value = t.at(TopicsDocument, name), t.value(TopicsDocument, name)
        topic = _text(issues, path, value)
        if topic is None:
            continue
        if not TOPIC_RE.fullmatch(topic):
            issues.error(path, "not a valid Kafka topic name ([A-Za-z0-9._-], at most 249 characters)", topic)
            continue
        out[name] = topic
    return out


def _kafka_input(issues: _Issues, k: _Where) -> dict[str, Any]:
    doc = _valid(KafkaInputDocument, k.raw)
    out: dict[str, Any] = {}
    p = k.at(KafkaInputDocument, "bootstrap_servers")
    bs = _text(issues, p, k.value(KafkaInputDocument, "bootstrap_servers"))
    if bs is not None:
        out["bootstrap_servers"] = bs
        issues.warn(p, f"{bs} is kept for reference; SIE consumes from the cluster in its own settings (SIE_BOOTSTRAP_SERVERS)")
    p = k.at(KafkaInputDocument, "topic")
    topic = _text(issues, p, k.value(KafkaInputDocument, "topic"))
    if topic is not None and not TOPIC_RE.fullmatch(topic):
        issues.error(p, "not a valid Kafka topic name ([A-Za-z0-9._-], at most 249 characters)", topic)
        topic = None
    out["topic"] = topic
    out["group_id"] = _text(issues, k.at(KafkaInputDocument, "group_id"), k.value(KafkaInputDocument, "group_id"))
    if doc is not None:
        for name in ("auto_offset_reset", "value_deserializer"):
            if k.value(KafkaInputDocument, name) is not _MISSING:
                out[name] = getattr(doc, name)
        if doc.enable_auto_commit is True:
            issues.warn(k.at(KafkaInputDocument, "enable_auto_commit"),
                        "ignored; SIE commits offsets inside its transaction after inference (exactly-once)")
    return out


def _rollout(issues: _Issues, path: str, value: Any, d: dict[str, Any]) -> None:
    """The rollout policy, checked now (``spec.rollout.steps: ...``), kept as written."""
    from sie.schemas.rollout_policy import Policy

    if not isinstance(value, dict):
        issues.error(path, "must be a mapping (steps, intervalSeconds, surgeTimeoutSeconds, gates)", value)
        return
    try:
        Policy.from_document(value)
    except ConfigError as exc:
        sub, _sep, reason = str(exc).removeprefix("rollout").partition(": ")
        issues.error(path + sub, reason)
        return
    d["rollout"] = value


_PROBE_WARNING = ("not used; SIE's readiness is a real inference on exampleInput, and the agent watches the process "
                  "(httpGet probes are not run)")
_IMAGE_WARNING = "SIE does not pull OCI images; the agent runs the backend from the local artifact/model path"


def _spec_sections(issues: _Issues, spec: _Where, d: dict[str, Any], paths: dict[str, str], base_dir: Path | None,
                   flat: bool) -> None:
    """Every section of ``spec`` (the flat style's top level), in the order the document is read."""
    S = SpecDocument  # noqa: N806 - the section's model, short
    paths["backend"] = spec.at(S, "backend")
    if spec.value(S, "backend") is not _MISSING:
        raw_backend = spec.value(S, "backend")
        d["backend"] = _backend(issues, _Where({"type": raw_backend} if flat and isinstance(raw_backend, str)
                                               else raw_backend, paths["backend"]), base_dir)
    paths["priority_level"] = spec.at(S, "priority_level")
    if spec.value(S, "priority_level") in ("P0", "P1", "P2"):
        d["priority_level"] = spec.value(S, "priority_level")
    st = spec.value(S, "service_type")
    if isinstance(st, str) and re.fullmatch(r"[a-z][a-z0-9_-]*", st):  # (else a shape problem)
        d["service_type"] = st
    paths["max_concurrent_requests"] = spec.at(S, "max_concurrent_requests")
    mc = spec.value(S, "max_concurrent_requests")
    if type(mc) is int and mc >= 1:
        d["max_concurrent_requests"] = mc
    if spec.value(S, "scheduling") is not _MISSING:
        d["scheduling"] = _scheduling(issues, spec.child(S, "scheduling"))
    paths["resources"] = spec.at(S, "resources")
    d["resources"] = _resources(issues, spec.child(S, "resources"))
    sla = spec.child(S, "sla")
    if flat and "slas" not in spec.raw and "sla" not in spec.raw:
        sla = _Where(None, "slas")
    paths["sla"] = sla.path
    d["sla"] = _sla(issues, sla)
    d["input_schema"] = _io_schema(issues, spec, "input_schema", "request inputs")
    d["output_schema"] = _io_schema(issues, spec, "output_schema", "model outputs")
    paths["example_input"] = spec.at(S, "example_input")
    example = spec.value(S, "example_input")
    if isinstance(example, dict):
        d["example_input"] = example
    elif example is not _MISSING and example is not None:
        issues.error(paths["example_input"], "must be a mapping of input fields", example)
    if spec.value(S, "topics") is not _MISSING:
        d["topics"] = _topics(issues, spec.child(S, "topics"))
    if spec.value(S, "kafka_input") is not _MISSING:
        paths["kafka_input"] = spec.at(S, "kafka_input")
        d["kafka_input"] = _kafka_input(issues, spec.child(S, "kafka_input"))
    for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
        if probe in spec.raw:
            issues.warn(spec.at(S, probe), _PROBE_WARNING)
    description = spec.value(S, "description")
    if description not in (_MISSING, None):
        d["description"] = str(description)
    labels = spec.value(S, "labels")
    if isinstance(labels, dict):
        d["labels"] = _labels(labels)
    if spec.value(S, "rollout") not in (_MISSING, None):
        _rollout(issues, spec.at(S, "rollout"), spec.value(S, "rollout"), d)


def _labels(value: dict[str, Any]) -> dict[str, str]:
    return {str(k): str(v).lower() if isinstance(v, bool) else str(v)
            for k, v in value.items() if not isinstance(v, (dict, list)) and v is not None}


def _flat(issues: _Issues, doc: dict[str, Any], base_dir: Path | None) -> tuple[dict[str, Any], dict[str, str]]:
    top = _Where(doc, "")
    d: dict[str, Any] = {"name": doc.get("name", _MISSING), "version": doc.get("version", _MISSING)}
    paths: dict[str, str] = {"name": "name", "version": "version"}
    if "image" in doc:
        issues.warn("image", _IMAGE_WARNING)
    if "backend" not in doc:
        issues.error("backend", "required; one of torch, python, sglang (or a mapping with type:)")
    gm_key = next((k for k in ("min_gpu_memory_mb", "minGpuMemoryMb") if k in doc), None)
    _spec_sections(issues, top, d, paths, base_dir, flat=True)
    gm = doc.get(gm_key) if gm_key is not None else None
    if gm_key is not None and type(gm) is int and gm >= 0:
        if "gpu_memory_mb" in d["resources"]:
            issues.error(gm_key, "given twice (also resources.gpuMemoryMb); keep one", gm)
        d["resources"]["gpu_memory_mb"] = gm
        paths["gpu_memory_mb"] = gm_key
    return d, paths


def _kubernetes(issues: _Issues, doc: dict[str, Any], base_dir: Path | None) -> tuple[dict[str, Any], dict[str, str]]:
    meta: dict[str, Any] = doc["metadata"] if isinstance(doc.get("metadata"), dict) else {}
    spec = _Where(doc.get("spec"), "spec")
    model: dict[str, Any] = spec.raw["model"] if isinstance(spec.raw.get("model"), dict) else {}
    d: dict[str, Any] = {}
    paths: dict[str, str] = {}
    if doc.get("apiVersion") is None:  # (a wrong one is a shape problem)
        issues.error("apiVersion", f"must be {API_VERSION}", None)
    ns = meta.get("namespace")
    if ns not in (None, "default"):
        issues.warn("metadata.namespace", f"namespace {ns!r} ignored; SIE model names are cluster-wide")
    annotations = meta.get("annotations")
    if isinstance(annotations, dict) and OWNER_ANNOTATION in annotations:
        owner = annotations[OWNER_ANNOTATION]
        if not isinstance(owner, str) or not 0 < len(owner) <= 400 or not owner.isprintable():
            issues.error(f"metadata.annotations.{OWNER_ANNOTATION}", "must be printable text of at most 400 characters",
                         owner)
        else:
            d["owner"] = owner
    if "image" in model:
        issues.warn("spec.model.image", _IMAGE_WARNING)
    name, name_path = model.get("name", _MISSING), "spec.model.name"
    meta_name = meta.get("name", _MISSING)
    if name is _MISSING:
        name, name_path = (meta_name, "metadata.name") if meta_name is not _MISSING else (_MISSING, name_path)
    elif meta_name is not _MISSING and meta_name != name:
        issues.error("metadata.name", f"must equal spec.model.name {name!r} (the model name keys the specs topic)",
                     meta_name)
    d["name"], paths["name"] = name, name_path
    d["version"], paths["version"] = model.get("version", _MISSING), "spec.model.version"
    _spec_sections(issues, spec, d, paths, base_dir, flat=False)
    labels = meta.get("labels")
    if isinstance(labels, dict) and labels:
        d.setdefault("labels", {}).update(_labels(labels))
    return d, paths


# ---------------------------------------------------------------- assembly


def _identity(issues: _Issues, d: dict[str, Any], paths: dict[str, str]) -> None:
    name, version = d.get("name", _MISSING), d.get("version", _MISSING)
    if name is _MISSING or name is None:
        issues.error(paths["name"], "required (the model name)")
    elif not isinstance(name, str) or not NAME_RE.fullmatch(name):
        issues.error(paths["name"], "must be lowercase [a-z0-9._-], start with a letter or digit, at most 200 characters "
                                    "(it names Kafka topics)", name)
    if version is _MISSING or version is None:
        issues.error(paths["version"], "required (e.g. 1.2.0)")
    elif isinstance(version, bool) or isinstance(version, float):
        issues.error(paths["version"], "must be a string; quote it (YAML read a number)", version)
    elif isinstance(version, int):
        d["version"] = str(version)
    elif not isinstance(version, str) or not VERSION_RE.fullmatch(version):
        issues.error(paths["version"], "must be [A-Za-z0-9._+-], at most 64 characters", version)


def _derive_sglang_gpu_memory(name: str, model_path: str | None, tp_size: int) -> tuple[int, str]:
    """A per-GPU memory figure for an sglang model that declares none.

    From the parameter count in the model name/path (``qwen2-7b`` -> 7e9):
    bf16 weights (2 bytes/param) split over ``tp_size`` GPUs, plus 50% for the
    KV cache and activations, rounded up to a GiB.  Otherwise a 16 GiB default.
    """
    for text in (model_path or "", name):
        match = re.search(r"(?<![a-z0-9.])(\d+(?:\.\d+)?)b(?![a-z])", text.lower())
        if match:
            billions = float(match.group(1))
            mb = billions * 2 * 1024 / max(tp_size, 1) * 1.5
            mb = int(math.ceil(mb / 1024) * 1024)
            return mb, f"{billions:g}B parameters in bf16 over tp_size {tp_size} + 50% for KV cache"
    return DEFAULT_SGLANG_GPU_MEMORY_MB, "default for an sglang model of unknown size"


def _finish(issues: _Issues, d: dict[str, Any], paths: dict[str, str], topic_prefix: str) -> dict[str, Any]:
    """Cross-section rules and defaults that need the whole document."""
    backend = d.get("backend")
    resources = d.setdefault("resources", {})
    if backend and backend["type"] == "sglang":
        tp = backend.get("config", {}).get("tp_size", 1)
        tp = tp if type(tp) is int and tp >= 1 else 1
        gpus = resources.get("gpus", 0)
        if gpus and gpus < tp:
            issues.warn(f"{paths['backend']}.config.tp_size",
                        f"tp_size {tp} needs {tp} GPUs but resources ask {gpus}; SIE reserves {tp} GPUs per replica")
            resources["gpus"] = tp
        if "gpu_memory_mb" not in resources:
            mb, how = _derive_sglang_gpu_memory(str(d.get("name") or ""), backend.get("model_path"), tp)
            resources["gpu_memory_mb"] = mb
            issues.warn(f"{paths['resources']}.gpuMemoryMb",
                        f"not given; derived {mb} MB per GPU ({how}); set gpuMemoryMb to override")
    name = given if isinstance(given := d.get("name"), str) else "invalid"
    defaults = ModelTopics.default_for(name, prefix=topic_prefix)
    topics = {"requests": defaults.requests, "results": defaults.results, "dead_letters": defaults.dead_letters,
              "backfill": defaults.backfill_results}
    overrides = d.pop("topics", {})
    ki = d.get("kafka_input")
    if ki and ki.get("topic"):
        if overrides.get("requests") not in (None, ki["topic"]):
            issues.error(f"{paths['kafka_input']}.topic",
                         f"differs from topics.requests {overrides['requests']!r}; keep one", ki["topic"])
        overrides.setdefault("requests", ki["topic"])
    topics.update(overrides)
    d["topics"] = topics
    d["group_id"] = (ki or {}).get("group_id") or Names(topic_prefix).scorer_group(name)
    if backend and backend["type"] in ("torch", "python") and "example_input" not in d:
        issues.warn(paths["example_input"], "absent; the readiness check has no real inference to run (add exampleInput)")
    return d


def _check_example(issues: _Issues, spec: ModelService, path: str) -> None:
    from sie.schemas.validation import SchemaViolation, compile_validator

    if spec.example_input is None:
        return
    try:
        compile_validator(spec.input_schema)(spec.example_input)
    except SchemaViolation as exc:
        issues.error(path, f"does not match inputSchema: {exc}")


def _shape_only(doc: dict[str, Any]) -> dict[str, Any]:
    """The document as ``document_problems`` should see it: without the rollout policy (``Policy`` words its
    own problems) and, in the Kubernetes style, with an empty ``spec`` where none is given (its required keys
    are reported one by one)."""
    if "apiVersion" in doc or "kind" in doc:
        spec = doc.get("spec", {})
        if isinstance(spec, dict) and "rollout" in spec:
            spec = {k: v for k, v in spec.items() if k != "rollout"}
        return {**doc, "spec": spec}
    return {k: v for k, v in doc.items() if k != "rollout"}


def build_spec(doc: Any, source: str = "<dict>", base_dir: Path | None = None, topic_prefix: str = "sie") -> ModelService:
    """Read a parsed YAML/JSON document of either style; raise ``InvalidSpec`` listing every problem."""
    if not isinstance(doc, dict):
        raise InvalidSpec(source, [f"document: must be a mapping (a ModelService), got {type(doc).__name__}"])
    if ("apiVersion" in doc or "kind" in doc) and doc.get("kind") != KIND:
        raise InvalidSpec(source, [f"kind: unknown kind; expected {KIND} (got {_got(doc.get('kind'))})"])
    issues = _Issues()
    for problem in document_problems(_shape_only(doc)):
        issues.error(*problem.split(": ", 1))
    if "apiVersion" in doc or "kind" in doc:
        d, paths = _kubernetes(issues, doc, base_dir)
    else:
        d, paths = _flat(issues, doc, base_dir)
    _identity(issues, d, paths)
    d = _finish(issues, d, paths, topic_prefix)
    if issues.errors or d.get("backend") is None:
        raise InvalidSpec(source, issues.errors or [f"{paths['backend']}: invalid"])
    d["warnings"] = tuple(issues.warnings)
    d["source"] = source
    try:
        spec = _assemble(d)
    except ValidationError as exc:  # an invariant the rules did not catch: still name the field
        raise InvalidSpec(source, [f"{'.'.join(map(str, e['loc']))}: {e['msg']} (got {_got(e.get('input'))})"
                                   for e in exc.errors()]) from None
    _check_example(issues, spec, paths["example_input"])
    if issues.errors:
        raise InvalidSpec(source, issues.errors)
    return spec


def _assemble(d: dict[str, Any]) -> ModelService:
    d = dict(d)
    d["backend"] = BackendSpec(**d["backend"])
    d["resources"] = Resources(**d.get("resources", {}))
    d["scheduling"] = Scheduling(**d.get("scheduling", {}))
    d["sla"] = Sla(**{k: v for k, v in d.get("sla", {}).items()
                      if v is not None or k in ("p99_latency_ms", "max_queue_time_ms", "min_qps")})
    d["topics"] = SpecTopics(**d["topics"])
    if d.get("kafka_input") is not None:
        d["kafka_input"] = KafkaInput(**d["kafka_input"])
    return ModelService(**d)
