"""Reduce a ModelService document (flat article style or Kubernetes style) to ``ModelService``.

Both styles are read by the same section readers; only the place of each
section differs.  Every problem is collected (not just the first) as a line
``<field path>: <reason> (got <value>)`` using the path as written in the
document, and raised together as one ``InvalidSpec``.  Things SIE accepts but
cannot honour (image pulls, tolerations, httpGet probes, foreign bootstrap
servers) become named warnings on the spec.  Unknown keys are errors: a typo
must never silently drop a constraint.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from sie.kernel.errors import ConfigError, SpecError
from sie.kernel.names import ModelTopics, Names, path_problem
from sie.schemas.spec_document import (
    API_VERSION,
    CALLABLE_RE,
    DEVICE_RE,
    KIND,
    NAME_RE,
    OWNER_ANNOTATION,
    TOPIC_RE,
    TYPE_ALIASES,
    VERSION_RE,
)
from sie.schemas.spec_models import (
    BACKEND_TYPES,
    FIELD_TYPES,
    PRIORITY_LEVELS,
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
_MISSING = object()


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
    """Collects errors and warnings while a document is read."""

    def __init__(self) -> None:
        self.errors: list[str] = []
        self.warnings: list[str] = []

    def error(self, path: str, reason: str, value: Any = _MISSING) -> None:
        self.errors.append(f"{path}: {reason}" + ("" if value is _MISSING else f" (got {_got(value)})"))

    def warn(self, path: str, reason: str) -> None:
        self.warnings.append(f"{path}: {reason}")


class _Section:
    """A mapping read key by key; keys not taken are reported as unknown by ``finish``.

    ``take("priorityLevel", "priority_level")`` accepts either spelling (both
    given is an error).  Returns ``(path, value)``; value is ``_MISSING`` if absent.
    """

    def __init__(self, data: Any, path: str, issues: _Issues) -> None:
        self.path = path
        self.issues = issues
        self.ok = isinstance(data, dict)
        if data is not None and not self.ok:
            issues.error(path or "document", "must be a mapping", data)
        self.data: dict = data if self.ok else {}
        self.taken: set[str] = set()

    def child_path(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path else key

    def take(self, *names: str) -> tuple[str, Any]:
        present = [n for n in names if n in self.data]
        self.taken.update(names)
        if not present:
            return self.child_path(names[0]), _MISSING
        if len(present) > 1:
            self.issues.error(self.child_path(present[0]), f"given twice (also as {present[1]!r}); keep one")
        return self.child_path(present[0]), self.data[present[0]]

    def has(self, *names: str) -> bool:
        self.taken.update(names)
        return any(n in self.data for n in names)

    def section(self, *names: str) -> _Section:
        path, value = self.take(*names)
        return _Section(None if value is _MISSING else value, path, self.issues)

    def finish(self, allowed_hint: str = "") -> None:
        for key in self.data:
            if key not in self.taken:
                hint = f"; known keys: {allowed_hint or ', '.join(sorted(self.taken))}"
                self.issues.error(self.child_path(str(key)), "unknown key" + hint)


# ---------------------------------------------------------------- scalar readers


def _int(issues: _Issues, path: str, value: Any, minimum: int | None = 0) -> int | None:
    if value is _MISSING or value is None:
        return None
    if type(value) is not int:
        issues.error(path, "must be an integer", value)
        return None
    if minimum is not None and value < minimum:
        issues.error(path, f"must be >= {minimum}", value)
        return None
    return value


def _number(issues: _Issues, path: str, value: Any, minimum: float | None = 0, strict: bool = False) -> float | None:
    if value is _MISSING or value is None:
        return None
    if type(value) not in (int, float) or not math.isfinite(value):
        issues.error(path, "must be a finite number", value)
        return None
    if minimum is not None and (value <= minimum if strict else value < minimum):
        issues.error(path, f"must be {'>' if strict else '>='} {minimum}", value)
        return None
    return float(value)


def _bool(issues: _Issues, path: str, value: Any) -> bool | None:
    if value is _MISSING or value is None:
        return None
    if value is not True and value is not False:
        issues.error(path, "must be true or false", value)
        return None
    return value


def _str(issues: _Issues, path: str, value: Any) -> str | None:
    if value is _MISSING or value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        issues.error(path, "must be a non-empty string", value)
        return None
    return value


def _str_map(issues: _Issues, path: str, value: Any) -> dict[str, str]:
    if value is _MISSING or value is None:
        return {}
    if not isinstance(value, dict):
        issues.error(path, "must be a mapping of strings", value)
        return {}
    out: dict[str, str] = {}
    for k, v in value.items():
        if isinstance(v, (dict, list)) or v is None:
            issues.error(f"{path}.{k}", "must be a string", v)
        else:
            out[str(k)] = str(v).lower() if isinstance(v, bool) else str(v)
    return out


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


# ---------------------------------------------------------------- section readers


def _read_field(issues: _Issues, item: Any, path: str) -> FieldSpec | None:
    sec = _Section(item, path, issues)
    if not sec.ok:
        return None
    name_path, name = sec.take("name")
    type_path, type_raw = sec.take("type")
    req_path, required = sec.take("required")
    null_path, nullable = sec.take("nullable")
    ml_path, max_length = sec.take("max_length", "maxLength")
    range_path, range_raw = sec.take("range")
    _, description = sec.take("description")
    sec.finish()
    ok = True
    if name is _MISSING:
        issues.error(name_path, "required")
        ok = False
    elif not isinstance(name, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.-]*", name):
        issues.error(name_path, "must be a field name (letters, digits, _ . -)", name)
        ok = False
    ftype = None
    if type_raw is _MISSING:
        issues.error(type_path, f"required; one of {', '.join(FIELD_TYPES)}")
        ok = False
    else:
        ftype = TYPE_ALIASES.get(str(type_raw).lower()) if isinstance(type_raw, str) else None
        if ftype is None:
            issues.error(type_path, f"unknown field type; valid: {', '.join(FIELD_TYPES)} (aliases: {', '.join(sorted(set(TYPE_ALIASES) - set(FIELD_TYPES)))})", type_raw)
            ok = False
    required_v = _bool(issues, req_path, required)
    nullable_v = _bool(issues, null_path, nullable)
    ml = _int(issues, ml_path, max_length, minimum=1)
    if ml is not None and ftype not in (None, "string"):
        issues.error(ml_path, f"only string fields take max_length (field type is {ftype})", max_length)
    bounds = None
    if range_raw is not _MISSING and range_raw is not None:
        if ftype not in (None, "int", "float"):
            issues.error(range_path, f"only int/float fields take a range (field type is {ftype})", range_raw)
        elif (
            not isinstance(range_raw, list)
            or len(range_raw) != 2
            or any(type(x) not in (int, float) or not math.isfinite(x) for x in range_raw)
        ):
            issues.error(range_path, "must be [min, max] with two finite numbers", range_raw)
        elif range_raw[0] > range_raw[1]:
            issues.error(range_path, f"min {range_raw[0]} > max {range_raw[1]}", range_raw)
        else:
            bounds = (float(range_raw[0]), float(range_raw[1]))
    if not ok:
        return None
    return FieldSpec(
        name=name,
        type=ftype,
        required=True if required_v is None else required_v,
        nullable=bool(nullable_v),
        max_length=ml,
        range=bounds,
        description=str(description) if description not in (_MISSING, None) else None,
    )


def _read_io_schema(issues: _Issues, parent: _Section, names: tuple[str, ...], what: str) -> IOSchema:
    path, raw = parent.take(*names)
    if raw is _MISSING or raw is None:
        issues.warn(path, f"absent; {what} are not validated (every field passes through)")
        return IOSchema(fields=(), unknown_fields="allow")
    sec = _Section(raw, path, issues)
    if not sec.ok:
        return IOSchema()
    type_path, type_raw = sec.take("type")
    if type_raw is not _MISSING and type_raw != "json":
        issues.error(type_path, "only 'json' is supported", type_raw)
    uf_path, unknown = sec.take("unknown_fields", "unknownFields")
    if unknown is _MISSING:
        unknown = "reject"
    elif unknown not in ("reject", "ignore", "allow"):
        issues.error(uf_path, "must be reject, ignore or allow", unknown)
        unknown = "reject"
    fields_path, fields_raw = sec.take("fields")
    sec.finish()
    fields: list[FieldSpec] = []
    if fields_raw is _MISSING or fields_raw is None:
        fields_raw = []
    if not isinstance(fields_raw, list):
        issues.error(fields_path, "must be a list of fields", fields_raw)
        fields_raw = []
    seen: dict[str, int] = {}
    for i, item in enumerate(fields_raw):
        f = _read_field(issues, item, f"{fields_path}[{i}]")
        if f is None:
            continue
        if f.name in seen:
            issues.error(f"{fields_path}[{i}].name", f"duplicate field name (also {fields_path}[{seen[f.name]}])", f.name)
            continue
        seen[f.name] = i
        fields.append(f)
    return IOSchema(fields=tuple(fields), unknown_fields=unknown)


def _infer_format(issues: _Issues, path: str, artifact: Path) -> str | None:
    fmt = SUFFIX_FORMATS.get(artifact.suffix.lower())
    if fmt is None:
        issues.error(path, f"cannot infer the format from suffix {artifact.suffix!r}; set format: torchscript|export|safetensors", str(artifact))
    return fmt


def _read_backend(issues: _Issues, sec: _Section, base_dir: Path | None) -> dict[str, Any] | None:
    type_path, btype = sec.take("type")
    art_path, artifact = sec.take("artifact")
    sha_path, sha256 = sec.take("sha256", "artifactSha256", "artifact_sha256")
    mod_path, modules = sec.take("modules")
    fmt_path, fmt = sec.take("format")
    mc_path, module_class = sec.take("moduleClass", "module_class")
    mk_path, module_kwargs = sec.take("moduleKwargs", "module_kwargs")
    call_path, call = sec.take("callable")
    mp_path, model_path = sec.take("modelPath", "model_path")
    cfg_path, config = sec.take("config")
    dev_path, device = sec.take("device")
    sec.finish()
    if btype is _MISSING:
        issues.error(type_path, f"required; one of {', '.join(BACKEND_TYPES)}")
        return None
    if btype not in BACKEND_TYPES:
        issues.error(type_path, f"unknown backend type; valid: {', '.join(BACKEND_TYPES)}", btype)
        return None
    out: dict[str, Any] = {"type": btype}
    if config is not _MISSING and config is not None:
        if not isinstance(config, dict):
            issues.error(cfg_path, "must be a mapping", config)
        else:
            out["config"] = dict(config)
            _check_backend_config(issues, cfg_path, btype, config)
    if module_kwargs is not _MISSING and module_kwargs is not None:
        if not isinstance(module_kwargs, dict):
            issues.error(mk_path, "must be a mapping", module_kwargs)
        else:
            out["module_kwargs"] = dict(module_kwargs)
    if device is not _MISSING:
        if not isinstance(device, str) or not DEVICE_RE.fullmatch(device):
            issues.error(dev_path, "must be auto, cpu, cuda or cuda:N", device)
        else:
            out["device"] = device
    foreign = {
        "torch": [(call_path, call), (mp_path, model_path)],
        "python": [(art_path, artifact), (sha_path, sha256), (fmt_path, fmt), (mc_path, module_class),
                   (mp_path, model_path)],
        "sglang": [(art_path, artifact), (sha_path, sha256), (mod_path, modules), (fmt_path, fmt),
                   (mc_path, module_class), (call_path, call)],
    }[btype]
    for path, value in foreign:
        if value is not _MISSING:
            issues.error(path, f"not used by the {btype} backend", value)
    if modules is not _MISSING and modules is not None and btype != "sglang":
        ref = _read_ref(issues, mod_path, modules, default_name="modules.zip")
        if ref is not None:
            out["modules"] = ref
    if btype == "torch":
        _read_torch(issues, out, base_dir, (art_path, artifact), (sha_path, sha256), (fmt_path, fmt),
                    (mc_path, module_class))
    elif btype == "python":
        if call is _MISSING or call is None:
            issues.error(call_path, "required for the python backend ('package.module:function')")
        elif not isinstance(call, str) or not CALLABLE_RE.fullmatch(call):
            issues.error(call_path, "must be 'package.module:function'", call)
        elif (problem := _module_path_problem(call)) is not None:
            issues.error(call_path, problem, call)
        else:
            out["callable"] = call
    else:
        mp = _str(issues, mp_path, model_path)
        if mp is None and model_path is _MISSING:
            issues.warn(mp_path, "not given; the node agent resolves the model by name from its local model directory")
        out["model_path"] = mp
    return out


def _module_path_problem(reference: str) -> str | None:
    """Why the module of ``package.module:name`` cannot be a file (``sie apply`` looks for ``package/module.py``
    next to the spec), or None: the module's path is checked like any path from data."""
    module = reference.partition(":")[0]
    problem = path_problem(module.replace(".", "/") + ".py")
    return None if problem is None else f"module {problem}"


def _read_ref(issues: _Issues, path: str, value: Any, default_name: str, sha256: Any = _MISSING) -> ArtifactRef | None:
    """An artifact named by content: ``{sha256, name, size, uri}`` (on the cluster's artifacts topic unless
    ``uri`` says where), or a URI string with ``sha256`` given next to it."""
    if isinstance(value, str):
        name = value.rstrip("/").rsplit("/", 1)[-1].split("?", 1)[0] or default_name
        value = {"uri": value, "name": name, **({} if sha256 is _MISSING else {"sha256": sha256})}
    elif not isinstance(value, dict):
        issues.error(path, "must be a mapping {sha256, name, size, uri} or a URI", value)
        return None
    sec = _Section(value, path, issues)
    sha_path, digest = sec.take("sha256")
    name_path, name = sec.take("name")
    size_path, size = sec.take("size")
    uri_path, uri = sec.take("uri")
    sec.finish()
    if digest is _MISSING or digest is None:
        issues.error(sha_path, "required: the sha256 (64 hex digits) every node checks the downloaded bytes against")
        return None
    if not isinstance(digest, str) or not _SHA256.fullmatch(digest.lower()):
        issues.error(sha_path, "must be 64 hex digits (sha256sum FILE)", digest)
        return None
    fields: dict[str, Any] = {"sha256": digest.lower(), "name": default_name}
    if name is not _MISSING and name is not None:
        fields["name"] = name
    if size is not _MISSING and size is not None:
        fields["size"] = _int(issues, size_path, size)
    if uri is not _MISSING and uri is not None:
        if not isinstance(uri, str) or not URI_RE.match(uri):
            issues.error(uri_path, "must be a URI (file://, https://, s3://, ...)", uri)
            return None
        fields["uri"] = uri
    try:
        return ArtifactRef(**fields)
    except ValidationError as exc:
        for e in exc.errors():
            field = ".".join(map(str, e["loc"]))
            issues.error(f"{path}.{field}" if field else path, e["msg"], e.get("input"))
        return None


def _read_torch(issues: _Issues, out: dict, base_dir: Path | None, art: tuple, sha: tuple, fmt_item: tuple,
                mc: tuple) -> None:
    (art_path, artifact), (sha_path, sha256), (fmt_path, fmt), (mc_path, module_class) = art, sha, fmt_item, mc
    if artifact is _MISSING or artifact is None:
        issues.error(art_path, "required for the torch backend (a .pt/.ts TorchScript, .pt2 export or .safetensors "
                               "file: a path, a URI with sha256, or {sha256, name} uploaded by sie apply)")
        return
    path: Path | None = None
    if isinstance(artifact, dict) or (isinstance(artifact, str) and URI_RE.match(artifact)):
        if isinstance(artifact, str) and sha256 is _MISSING:
            issues.error(sha_path, f"required with an artifact URI: every node checks the download against it "
                                   f"(sha256sum the file; got artifact {_got(artifact)})")
            return
        if isinstance(artifact, dict) and sha256 is not _MISSING:
            issues.error(sha_path, f"give the digest once, in {art_path}.sha256", sha256)
        ref = _read_ref(issues, art_path, artifact, default_name="artifact", sha256=sha256)
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
            if not isinstance(sha256, str) or not _SHA256.fullmatch(sha256.lower()):
                issues.error(sha_path, "must be 64 hex digits (sha256sum FILE)", sha256)
            else:
                from sie.schemas.artifact_cache import file_sha256

                actual = file_sha256(path)
                if actual != sha256.lower():
                    issues.error(sha_path, f"{path} has sha256 {actual}; the spec expects another file", sha256)
        out["artifact"] = path
        name = path
    if fmt is _MISSING or fmt is None:
        fmt = _infer_format(issues, art_path, name)
    elif fmt not in SUFFIX_FORMATS.values():
        issues.error(fmt_path, "must be torchscript, export or safetensors", fmt)
        fmt = None
    out["format"] = fmt
    if module_class is not _MISSING and module_class is not None:
        if not isinstance(module_class, str) or not CALLABLE_RE.fullmatch(module_class):
            issues.error(mc_path, "must be 'package.module:Class'", module_class)
        elif (problem := _module_path_problem(module_class)) is not None:
            issues.error(mc_path, problem, module_class)
        else:
            out["module_class"] = module_class
    if fmt == "safetensors" and "module_class" not in out and (module_class is _MISSING or module_class is None):
        issues.error(mc_path, "required with a safetensors artifact (the nn.Module to load the weights into)")


def _check_backend_config(issues: _Issues, path: str, btype: str, config: dict) -> None:
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


def _read_sla(issues: _Issues, sec: _Section) -> dict[str, Any]:
    out: dict[str, Any] = {}
    p, v = sec.take("p99_latency_ms", "p99LatencyMs")
    out["p99_latency_ms"] = _number(issues, p, v, minimum=0, strict=True)
    p, v = sec.take("max_queue_time_ms", "maxQueueTimeMs")
    out["max_queue_time_ms"] = _number(issues, p, v, minimum=0, strict=True)
    p, v = sec.take("min_qps", "minQps")
    out["min_qps"] = _number(issues, p, v, minimum=0)
    pmin, vmin = sec.take("min_replicas", "minReplicas")
    pmax, vmax = sec.take("max_replicas", "maxReplicas")
    sec.finish()
    lo = _int(issues, pmin, vmin, minimum=0)
    hi = _int(issues, pmax, vmax, minimum=1)
    lo = 1 if lo is None else lo
    hi = max(lo, 1) if hi is None else hi
    if lo > hi:
        issues.error(pmin, f"must be <= max_replicas {hi}", lo)
        lo = hi
    out["min_replicas"], out["max_replicas"] = lo, hi
    return out


def _read_resources(issues: _Issues, sec: _Section) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kind in ("limits", "requests"):
        sub = sec.section(kind)
        for key, value in sub.data.items():
            sub.taken.add(key)
            path = sub.child_path(str(key))
            if key == "nvidia.com/gpu":
                n = _int(issues, path, value, minimum=0)
                if n is not None:
                    out.setdefault("gpus", n)
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
    p, v = sec.take("gpuMemoryMb", "gpu_memory_mb")
    gm = _int(issues, p, v)
    if gm is not None:
        out["gpu_memory_mb"] = gm
    p, v = sec.take("gpus")
    n = _int(issues, p, v)
    if n is not None:
        out["gpus"] = n
    p, v = sec.take("cpu")
    c = _number(issues, p, v)
    if c is not None:
        out["cpu"] = c
    p, v = sec.take("memoryMb", "memory_mb")
    m = _int(issues, p, v)
    if m is not None:
        out["memory_mb"] = m
    sec.finish()
    return out


def _read_scheduling(issues: _Issues, sec: _Section) -> dict[str, Any]:
    p, v = sec.take("nodeSelector", "node_selector")
    selector = _str_map(issues, p, v)
    p, v = sec.take("tolerations")
    if v is not _MISSING and v:
        issues.warn(p, "tolerations are a Kubernetes taint concept; outside Kubernetes SIE places by nodeSelector and tier only")
    p, v = sec.take("tier")
    tier = _str(issues, p, v)
    sec.finish()
    return {"node_selector": selector, "tier": tier}


def _read_kafka_input(issues: _Issues, sec: _Section) -> dict[str, Any]:
    out: dict[str, Any] = {}
    p, v = sec.take("bootstrap_servers", "bootstrapServers")
    bs = _str(issues, p, v)
    if bs is not None:
        out["bootstrap_servers"] = bs
        issues.warn(p, f"{bs} is kept for reference; SIE consumes from the cluster in its own settings (SIE_BOOTSTRAP_SERVERS)")
    p, v = sec.take("topic")
    topic = _str(issues, p, v)
    if topic is not None and not TOPIC_RE.fullmatch(topic):
        issues.error(p, "not a valid Kafka topic name ([A-Za-z0-9._-], at most 249 characters)", topic)
        topic = None
    out["topic"] = topic
    p, v = sec.take("group_id", "groupId")
    out["group_id"] = _str(issues, p, v)
    p, v = sec.take("auto_offset_reset", "autoOffsetReset")
    if v is not _MISSING:
        if v not in ("earliest", "latest"):
            issues.error(p, "must be earliest or latest", v)
        else:
            out["auto_offset_reset"] = v
    p, v = sec.take("value_deserializer", "valueDeserializer")
    if v is not _MISSING:
        if v != "json":
            issues.error(p, "only json is supported (requests are JSON objects)", v)
        else:
            out["value_deserializer"] = v
    p, v = sec.take("enable_auto_commit", "enableAutoCommit")
    if v is True:
        issues.warn(p, "ignored; SIE commits offsets inside its transaction after inference (exactly-once)")
    sec.finish()
    return out


def _read_topics(issues: _Issues, sec: _Section) -> dict[str, str]:
    out: dict[str, str] = {}
    for key, names in (
        ("requests", ("requests",)),
        ("results", ("results",)),
        ("dead_letters", ("deadLetters", "dead_letters")),
        ("backfill", ("backfill",)),
    ):
        p, v = sec.take(*names)
        topic = _str(issues, p, v)
        if topic is None:
            continue
        if not TOPIC_RE.fullmatch(topic):
            issues.error(p, "not a valid Kafka topic name ([A-Za-z0-9._-], at most 249 characters)", topic)
            continue
        out[key] = topic
    sec.finish()
    return out


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


# ---------------------------------------------------------------- the two document styles


class _Doc:
    """Everything read from a document, before it becomes a ModelService."""

    def __init__(self) -> None:
        self.fields: dict[str, Any] = {}
        self.paths: dict[str, str] = {}


def _common_sections(issues: _Issues, sec: _Section, d: dict[str, Any], paths: dict[str, str], base_dir: Path | None,
                     flat: bool) -> None:
    """Sections named the same in both styles (camelCase or snake_case)."""
    p, v = sec.take("priorityLevel", "priority_level")
    paths["priority_level"] = p
    if v is not _MISSING:
        if v not in PRIORITY_LEVELS:
            issues.error(p, f"must be one of {', '.join(PRIORITY_LEVELS)}", v)
        else:
            d["priority_level"] = v
    p, v = sec.take("serviceType", "service_type")
    st = _str(issues, p, v)
    if st is not None:
        if not re.fullmatch(r"[a-z][a-z0-9_-]*", st):
            issues.error(p, "must be lowercase letters, digits, _ or - (a metrics label)", st)
        else:
            d["service_type"] = st
    p, v = sec.take("maxConcurrentRequests", "max_concurrent_requests")
    paths["max_concurrent_requests"] = p
    mc = _int(issues, p, v, minimum=1)
    if mc is not None:
        d["max_concurrent_requests"] = mc
    if sec.has("scheduling"):
        d["scheduling"] = _read_scheduling(issues, sec.section("scheduling"))
    res = sec.section("resources")
    paths["resources"] = res.path
    d["resources"] = _read_resources(issues, res)
    sla_names = ("slas", "sla") if flat else ("sla", "slas")
    sla = sec.section(*sla_names)
    d["sla"] = _read_sla(issues, sla)
    paths["sla"] = sla.path
    d["input_schema"] = _read_io_schema(issues, sec, ("inputSchema", "input_schema"), "request inputs")
    d["output_schema"] = _read_io_schema(issues, sec, ("outputSchema", "output_schema"), "model outputs")
    p, v = sec.take("exampleInput", "example_input")
    paths["example_input"] = p
    if v is not _MISSING and v is not None:
        if not isinstance(v, dict):
            issues.error(p, "must be a mapping of input fields", v)
        else:
            d["example_input"] = v
    if sec.has("topics"):
        d["topics"] = _read_topics(issues, sec.section("topics"))
        paths["topics"] = sec.child_path("topics")
    if sec.has("kafka_input", "kafkaInput"):
        ki = sec.section("kafka_input", "kafkaInput")
        paths["kafka_input"] = ki.path
        d["kafka_input"] = _read_kafka_input(issues, ki)
    for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
        p, v = sec.take(probe)
        if v is not _MISSING:
            issues.warn(p, "not used; SIE's readiness is a real inference on exampleInput, and the agent watches the process (httpGet probes are not run)")
    p, v = sec.take("description")
    if v is not _MISSING and v is not None:
        d["description"] = str(v)
    p, v = sec.take("labels")
    if v is not _MISSING:
        d["labels"] = _str_map(issues, p, v)
    p, v = sec.take("rollout")
    if v is not _MISSING and v is not None:
        _read_rollout(issues, p, v, d)


def _read_rollout(issues: _Issues, path: str, value: Any, d: dict[str, Any]) -> None:
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


def _read_flat(issues: _Issues, doc: dict, base_dir: Path | None) -> tuple[dict[str, Any], dict[str, str]]:
    sec = _Section(doc, "", issues)
    d: dict[str, Any] = {}
    paths: dict[str, str] = {}
    p, v = sec.take("name")
    paths["name"] = p
    d["name"] = v
    p, v = sec.take("version")
    paths["version"] = p
    d["version"] = v
    p, v = sec.take("image")
    if v is not _MISSING:
        issues.warn(p, "SIE does not pull OCI images; the agent runs the backend from the local artifact/model path")
    p, v = sec.take("backend")
    paths["backend"] = p
    if v is _MISSING:
        issues.error(p, f"required; one of {', '.join(BACKEND_TYPES)} (or a mapping with type:)")
    elif isinstance(v, str):
        d["backend"] = _read_backend(issues, _Section({"type": v}, p, issues), base_dir)
    else:
        d["backend"] = _read_backend(issues, _Section(v, p, issues), base_dir)
    p, v = sec.take("min_gpu_memory_mb", "minGpuMemoryMb")
    gm = _int(issues, p, v)
    _common_sections(issues, sec, d, paths, base_dir, flat=True)
    if gm is not None:
        if "gpu_memory_mb" in d["resources"]:
            issues.error(p, "given twice (also resources.gpuMemoryMb); keep one", v)
        d["resources"]["gpu_memory_mb"] = gm
        paths["gpu_memory_mb"] = p
    sec.finish()
    return d, paths


def _read_k8s(issues: _Issues, doc: dict, base_dir: Path | None) -> tuple[dict[str, Any], dict[str, str]]:
    top = _Section(doc, "", issues)
    p, api = top.take("apiVersion")
    if api != API_VERSION:
        issues.error(p, f"must be {API_VERSION}", api if api is not _MISSING else None)
    p, kind = top.take("kind")
    meta = top.section("metadata")
    spec = top.section("spec")
    top.finish("apiVersion, kind, metadata, spec")
    d: dict[str, Any] = {}
    paths: dict[str, str] = {}
    mp, meta_name = meta.take("name")
    p, ns = meta.take("namespace")
    if ns not in (_MISSING, None, "default"):
        issues.warn(p, f"namespace {ns!r} ignored; SIE model names are cluster-wide")
    p, v = meta.take("labels")
    labels = _str_map(issues, p, v)
    p, annotations = meta.take("annotations")
    if isinstance(annotations, dict) and OWNER_ANNOTATION in annotations:
        owner = annotations[OWNER_ANNOTATION]
        if not isinstance(owner, str) or not 0 < len(owner) <= 400 or not owner.isprintable():
            issues.error(f"{p}.{OWNER_ANNOTATION}", "must be printable text of at most 400 characters", owner)
        else:
            d["owner"] = owner
    meta.finish()
    model = spec.section("model")
    p_name, name = model.take("name")
    p_ver, version = model.take("version")
    p, image = model.take("image")
    if image is not _MISSING:
        issues.warn(p, "SIE does not pull OCI images; the agent runs the backend from the local artifact/model path")
    model.finish()
    if name is _MISSING:
        name, p_name = (meta_name, mp) if meta_name is not _MISSING else (_MISSING, p_name)
    elif meta_name is not _MISSING and meta_name != name:
        issues.error(mp, f"must equal spec.model.name {name!r} (the model name keys the specs topic)", meta_name)
    d["name"], paths["name"] = name, p_name
    d["version"], paths["version"] = version, p_ver
    p, v = spec.take("backend")
    paths["backend"] = p
    if v is _MISSING:
        issues.error(p, f"required (type: one of {', '.join(BACKEND_TYPES)})")
    else:
        d["backend"] = _read_backend(issues, _Section(v, p, issues), base_dir)
    _common_sections(issues, spec, d, paths, base_dir, flat=False)
    spec.finish()
    if labels:
        d.setdefault("labels", {}).update(labels)
    return d, paths


# ---------------------------------------------------------------- assembly


def _check_identity(issues: _Issues, d: dict[str, Any], paths: dict[str, str]) -> None:
    name, version = d.get("name", _MISSING), d.get("version", _MISSING)
    if name is _MISSING or name is None:
        issues.error(paths["name"], "required (the model name)")
    elif not isinstance(name, str) or not NAME_RE.fullmatch(name):
        issues.error(paths["name"], "must be lowercase [a-z0-9._-], start with a letter or digit, at most 200 characters (it names Kafka topics)", name)
    if version is _MISSING or version is None:
        issues.error(paths["version"], "required (e.g. 1.2.0)")
    elif isinstance(version, bool) or isinstance(version, float):
        issues.error(paths["version"], "must be a string; quote it (YAML read a number)", version)
    elif isinstance(version, int):
        d["version"] = str(version)
    elif not isinstance(version, str) or not VERSION_RE.fullmatch(version):
        issues.error(paths["version"], "must be [A-Za-z0-9._+-], at most 64 characters", version)


def _finish(issues: _Issues, d: dict[str, Any], paths: dict[str, str], topic_prefix: str) -> dict[str, Any]:
    """Cross-field rules and defaults that need the whole document."""
    backend = d.get("backend")
    resources = d.setdefault("resources", {})
    if backend and backend["type"] == "sglang":
        tp = backend.get("config", {}).get("tp_size", 1)
        tp = tp if type(tp) is int and tp >= 1 else 1
        gpus = resources.get("gpus", 0)
        if gpus and gpus < tp:
            issues.warn(
                f"{paths['backend']}.config.tp_size",
                f"tp_size {tp} needs {tp} GPUs but resources ask {gpus}; SIE reserves {tp} GPUs per replica",
            )
            resources["gpus"] = tp
        if "gpu_memory_mb" not in resources:
            mb, how = _derive_sglang_gpu_memory(str(d.get("name") or ""), backend.get("model_path"), tp)
            resources["gpu_memory_mb"] = mb
            issues.warn(
                f"{paths['resources']}.gpuMemoryMb",
                f"not given; derived {mb} MB per GPU ({how}); set gpuMemoryMb to override",
            )
    name = given if isinstance(given := d.get("name"), str) else "invalid"
    defaults = ModelTopics.default_for(name, prefix=topic_prefix)
    topics = {
        "requests": defaults.requests,
        "results": defaults.results,
        "dead_letters": defaults.dead_letters,
        "backfill": defaults.backfill_results,
    }
    overrides = d.pop("topics", {})
    ki = d.get("kafka_input")
    if ki and ki.get("topic"):
        if overrides.get("requests") not in (None, ki["topic"]):
            issues.error(f"{paths['kafka_input']}.topic", f"differs from topics.requests {overrides['requests']!r}; keep one", ki["topic"])
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


def build_spec(doc: Any, source: str = "<dict>", base_dir: Path | None = None, topic_prefix: str = "sie") -> ModelService:
    """Read a parsed YAML/JSON document of either style; raise ``InvalidSpec`` listing every problem."""
    issues = _Issues()
    if not isinstance(doc, dict):
        raise InvalidSpec(source, [f"document: must be a mapping (a ModelService), got {type(doc).__name__}"])
    if "apiVersion" in doc or "kind" in doc:
        kind = doc.get("kind")
        if kind != KIND:
            raise InvalidSpec(source, [f"kind: unknown kind; expected {KIND} (got {_got(kind)})"])
        d, paths = _read_k8s(issues, doc, base_dir)
    else:
        d, paths = _read_flat(issues, doc, base_dir)
    _check_identity(issues, d, paths)
    d = _finish(issues, d, paths, topic_prefix)
    if issues.errors or d.get("backend") is None:
        raise InvalidSpec(source, issues.errors or [f"{paths['backend']}: invalid"])
    d["warnings"] = tuple(issues.warnings)
    d["source"] = source
    try:
        spec = _assemble(d)
    except ValidationError as exc:  # an invariant the readers did not catch: still name the field
        raise InvalidSpec(source, [f"{'.'.join(map(str, e['loc']))}: {e['msg']} (got {_got(e.get('input'))})" for e in exc.errors()]) from None
    _check_example(issues, spec, paths["example_input"])
    if issues.errors:
        raise InvalidSpec(source, issues.errors)
    return spec


def _assemble(d: dict[str, Any]) -> ModelService:
    d = dict(d)
    d["backend"] = BackendSpec(**d["backend"])
    d["resources"] = Resources(**d.get("resources", {}))
    d["scheduling"] = Scheduling(**d.get("scheduling", {}))
    d["sla"] = Sla(**{k: v for k, v in d.get("sla", {}).items() if v is not None or k in ("p99_latency_ms", "max_queue_time_ms", "min_qps")})
    d["topics"] = SpecTopics(**d["topics"])
    if d.get("kafka_input") is not None:
        d["kafka_input"] = KafkaInput(**d["kafka_input"])
    return ModelService(**d)

