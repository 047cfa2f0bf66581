"""What a spec may make a node do: which code it may import, which files it may load, how much data it carries.

WHY a policy separate from the parser: the parser checks that a document is a well-formed
ModelService; this module checks that it is *allowed on this node*.  A spec names code
(``backend.moduleClass``, ``backend.callable``) that a worker imports and calls, and files
(``backend.artifact``) that it opens, so whoever can apply a spec (the API, the specs topic, the
assignments topic) could otherwise run anything as the worker's user.  The checks:

* ``moduleClass`` / ``callable`` must name a module inside an allow-list of prefixes configured on the
  node (``SIE_ALLOWED_MODULES``, default the demo's ``models.fraud``; the standard library and SIE
  itself can never be allowed, ``sie.kernel.settings`` refuses them) and no ``__dunder`` attribute;
* ``backend.artifact`` (and a local ``modelPath``, and ``modulesPath``) must resolve, symlinks followed,
  under one of the node's model roots (``SIE_MODEL_ROOTS``; default ``<cache_dir>/models`` and the
  packaged demo; the artifact cache ``<cache_dir>/artifacts``, where only files verified by sha256 land,
  always is one);
* an artifact named by content (``artifactRef``, ``modules``) with a URI must come from a source this node
  allows: ``file://`` under a model root, anything else under a prefix of ``SIE_ARTIFACT_SOURCES``;
* an sglang spec's ``config.server_entry`` (the program its node runs instead of ``python -m
  sglang.launch_server``) must be listed in ``SIE_SGLANG_SERVER_ENTRIES``; ``config.extra_args`` is resolved with
  SGLang's own argument table and may set only allowed destinations, never one SIE sets (``sie.schemas.sglang_args``:
  ``--trust-remote`` is ``--trust-remote-code``, allowed only where ``SIE_SGLANG_TRUST_REMOTE_CODE`` says so);
* an sglang spec's ``config.server_url`` / ``config.endpoints`` (servers every worker sends the model's requests
  to) must be http(s) URLs under a prefix of ``SIE_SGLANG_ENDPOINTS`` (default none);
* the model's name, its topic overrides (``topics``, ``kafka_input.topic``) and its group (``kafka_input.group_id``)
  must pass the naming module (``sie.kernel.names``): nothing under the cluster's prefix but the model's own names,
  so no spec makes a scorer write ``<p>.specs`` or an ``ensure`` flip a system topic's cleanup policy;
* ``moduleKwargs``, ``config`` and ``exampleInput`` must be plain data (strings, numbers, booleans,
  null, lists, string-keyed maps) of bounded depth and size.

The SAME ``SpecPolicy.check`` runs wherever a spec is read: ``sie validate``/``sie apply``, ``POST
/v1/models``, the control plane's view of the specs topic, the agent before it launches a worker, and
the worker before it imports anything.  Each problem names the field, like the parser's.
"""

from __future__ import annotations

import importlib.resources
import json
import math
import os
import re
import shlex
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import unquote, urlsplit

from sie.kernel.settings import DEFAULT_ALLOWED_MODULES, Settings

#: ``package.module:attr[.attr]`` (the parser's CALLABLE_RE, repeated here for data read back from Kafka)
REFERENCE_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
#: bounds of the free-form maps of a spec (moduleKwargs, backend.config, exampleInput)
MAX_DATA_DEPTH = 8
MAX_DATA_BYTES = {"module_kwargs": 16 * 1024, "config": 64 * 1024, "example_input": 64 * 1024}
_FIELD_NAMES = {"module_kwargs": "spec.backend.moduleKwargs", "config": "spec.backend.config",
                "example_input": "spec.exampleInput"}


def module_allowed(module: str, prefixes: Iterable[str]) -> bool:
    """Whether ``module`` is one of ``prefixes`` or a submodule of one (``a.b`` allows ``a.b.c``, not ``a.bc``)."""
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def packaged_demo_root() -> Path:
    """The installed ``sie.examples`` folder: the demo's specs and model package (read-only package data)."""
    return Path(str(importlib.resources.files("sie.examples"))).resolve()


def source_allowed(uri: str, sources: Iterable[str]) -> bool:
    """``uri`` is under one of ``sources`` (same scheme and host, path below the prefix's path at a ``/``)."""
    try:
        target = urlsplit(uri)
    except ValueError:
        return False
    if target.username or target.password:  # credentials belong in the node's config, not in a spec
        return False
    for source in sources:
        prefix = urlsplit(source)
        if (target.scheme, (target.netloc or "").lower()) != (prefix.scheme, (prefix.netloc or "").lower()):
            continue
        base = prefix.path
        under = not base or target.path == base or target.path.startswith(base if base.endswith("/") else base + "/")
        if under and ".." not in PurePosixPath(unquote(target.path)).parts:
            return True
    return False


def endpoint_allowed(url: str, entries: Iterable[str]) -> bool:
    """``url`` is under one of ``entries``: a URL prefix (``source_allowed``) or a host name (any port, http(s))."""
    parts = urlsplit(url)
    if parts.username or parts.password or parts.scheme not in ("http", "https"):
        return False
    host = (parts.hostname or "").lower()
    whole = url if parts.path else url + "/"  # http://h:1 is http://h:1/, under the prefix http://h:1/
    return any(source_allowed(whole, [e]) if "://" in e else host == e.strip("[]").lower() for e in entries)


def _real(path: Path) -> Path:
    return Path(os.path.realpath(path))


def _within(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


@dataclass(frozen=True)
class SpecPolicy:
    """The node's rules for specs (see the module docstring). Build it with ``from_settings``."""

    allowed_modules: tuple[str, ...] = DEFAULT_ALLOWED_MODULES
    model_roots: tuple[Path, ...] = field(default_factory=tuple)
    #: URI prefixes artifacts may be downloaded from (``SIE_ARTIFACT_SOURCES``)
    artifact_sources: tuple[str, ...] = ()
    #: argv prefixes an sglang spec's ``server_entry`` may name, shell-quoted (``SIE_SGLANG_SERVER_ENTRIES``)
    server_entries: tuple[str, ...] = ()
    #: whether an sglang spec may pass ``--trust-remote-code`` (``SIE_SGLANG_TRUST_REMOTE_CODE``)
    trust_remote_code: bool = False
    #: URL prefixes an sglang spec's ``server_url`` / ``endpoints`` may name (``SIE_SGLANG_ENDPOINTS``)
    endpoints: tuple[str, ...] = ()
    #: the cluster's topic prefix (``SIE_TOPIC_PREFIX``): what a spec's topic and group overrides may not name
    topic_prefix: str = "sie"
    #: SGLang destinations this node allows besides ``sglang_args.ALLOWED_DESTS`` (``SIE_SGLANG_EXTRA_ARGS``)
    sglang_extra_dests: tuple[str, ...] = ()

    @classmethod
    def from_settings(cls, settings: Settings, extra_roots: Iterable[Path] = ()) -> SpecPolicy:
        """The policy of this node; ``extra_roots``: e.g. the folder of a spec file read on this machine."""
        roots = list(settings.model_roots) if settings.model_roots is not None else [
            settings.cache_dir / "models", packaged_demo_root()]
        roots.append(settings.artifact_cache_dir)  # only files verified against a spec's sha256 land there
        roots.extend(extra_roots)
        from sie.schemas.sglang_args import node_dests

        return cls(tuple(settings.allowed_modules), tuple(_real(Path(r).expanduser()) for r in dict.fromkeys(roots)),
                   tuple(settings.artifact_sources),
                   tuple(_normalised_entry(e) for e in settings.sglang_server_entries),
                   settings.sglang_trust_remote_code, tuple(settings.sglang_endpoints), settings.topic_prefix,
                   node_dests(settings.sglang_extra_args))

    # -- the checks ------------------------------------------------------------------------------------
    def check(self, spec: Any) -> list[str]:
        """Every problem of ``spec`` (a ``ModelService``) under this policy, one ``field: reason`` line each."""
        problems: list[str] = []
        backend = spec.backend
        for attr, path in (("module_class", "spec.backend.moduleClass"), ("callable", "spec.backend.callable")):
            ref = getattr(backend, attr, None)
            if ref is not None:
                problems.extend(self.check_reference(ref, path))
        if backend.artifact is not None:
            problems.extend(self.check_path(backend.artifact, "spec.backend.artifact"))
        for attr, path in (("artifact_ref", "spec.backend.artifact"), ("modules", "spec.backend.modules")):
            ref = getattr(backend, attr, None)
            if ref is not None and ref.uri is not None:
                problems.extend(self.check_uri(ref.uri, f"{path}.uri"))
        modules_path = getattr(backend, "modules_path", None)
        if modules_path is not None:
            problems.extend(self.check_path(modules_path, "spec.backend.modulesPath"))
        model_path = getattr(backend, "model_path", None)
        if model_path and (model_path.startswith(("/", "~", ".")) or ".." in PurePosixPath(model_path).parts):
            problems.extend(self.check_path(model_path, "spec.backend.modelPath"))
        for attr in ("module_kwargs", "config"):
            problems.extend(check_plain_data(getattr(backend, attr, None) or {}, _FIELD_NAMES[attr], MAX_DATA_BYTES[attr]))
        if getattr(backend, "type", None) == "sglang":
            problems.extend(self.check_server_command(getattr(backend, "config", None) or {}))
            problems.extend(self.check_endpoints(getattr(backend, "config", None) or {}))
        example = getattr(spec, "example_input", None)
        if example is not None:
            problems.extend(check_plain_data(example, _FIELD_NAMES["example_input"], MAX_DATA_BYTES["example_input"]))
        problems.extend(self.check_names(spec))
        return problems

    def check_names(self, spec: Any) -> list[str]:
        """The model's name, topics and group under the naming module's rules (``Names.data_topic_problem``)."""
        from sie.kernel.errors import ConfigError
        from sie.kernel.names import Names, check_model_name

        try:
            check_model_name(spec.name, "spec.model.name")
        except ConfigError as exc:
            return [str(exc)]
        names = Names(self.topic_prefix)
        problems = []
        topics = getattr(spec, "topics", None)
        for attr, path in (("requests", "spec.topics.requests"), ("results", "spec.topics.results"),
                           ("dead_letters", "spec.topics.deadLetters"), ("backfill", "spec.topics.backfill")):
            topic = getattr(topics, attr, None)
            problem = names.data_topic_problem(spec.name, topic) if topic is not None else None
            if problem:
                problems.append(f"{path}: {problem}")
        group = getattr(spec, "group_id", None)
        problem = names.group_problem(spec.name, group) if group is not None else None
        if problem:
            problems.append(f"spec.kafka_input.group_id: {problem}")
        return problems

    def check_reference(self, ref: Any, path: str) -> list[str]:
        """``package.module:attr`` inside the allow-list, with no ``__dunder`` step."""
        if not isinstance(ref, str) or not REFERENCE_RE.fullmatch(ref):
            return [f"{path}: must be 'package.module:name' (got {_short(ref)})"]
        module, _, attr = ref.partition(":")
        if any(part.startswith("__") for part in attr.split(".")):
            return [f"{path}: {ref!r} reaches a __dunder__ attribute; name a class or function of the module"]
        if not module_allowed(module, self.allowed_modules):
            return [f"{path}: module {module!r} is not in this node's allowed modules "
                    f"({', '.join(self.allowed_modules) or 'none'}); set SIE_ALLOWED_MODULES on every node to allow "
                    "your model package (got " + _short(ref) + ")"]
        return []

    def check_server_command(self, config: Any) -> list[str]:
        """An sglang spec's ``server_entry`` (the program the node runs) must be one this node allows, and
        ``extra_args`` may set only the SGLang destinations this node allows (``sie.schemas.sglang_args``):
        either would otherwise let whoever applies a spec run code as the worker's user, or move SIE's own
        ``--model-path``/``--host``/``--port``."""
        problems: list[str] = []
        entry = config.get("server_entry") if isinstance(config, dict) else None
        if entry is not None:
            if not isinstance(entry, list) or not entry or not all(isinstance(a, str) for a in entry):
                problems.append(f"spec.backend.config.server_entry: must be a non-empty list of strings "
                                f"(got {_short(entry)})")
            elif shlex.join(entry) not in self.server_entries:
                problems.append(
                    f"spec.backend.config.server_entry: {_short(shlex.join(entry))} is not one of this node's allowed "
                    "server entries; leave it out to run `python -m sglang.launch_server`, or list it in "
                    "SIE_SGLANG_SERVER_ENTRIES on every node")
        if isinstance(config, dict):
            from sie.schemas.sglang_args import allowed_dests, check_extra_args

            allowed = allowed_dests(self.sglang_extra_dests, self.trust_remote_code)
            problems.extend(check_extra_args(config.get("extra_args"), allowed, config=config))
        return problems

    def check_endpoints(self, config: Any) -> list[str]:
        """``server_url`` / ``endpoints``: every worker sends the model's example input and then every request's
        prompt there, so a spec may name only servers this node lists (``SIE_SGLANG_ENDPOINTS``), over http(s),
        without credentials in the URL."""
        if not isinstance(config, dict):
            return []
        named: list[tuple[str, Any]] = []
        if config.get("server_url") is not None:
            named.append(("spec.backend.config.server_url", config["server_url"]))
        endpoints = config.get("endpoints")
        if isinstance(endpoints, list):
            for i, item in enumerate(endpoints):
                named.append((f"spec.backend.config.endpoints[{i}]",
                              item.get("url") if isinstance(item, dict) else item))
        elif endpoints is not None:
            return [f"spec.backend.config.endpoints: must be a list of URLs or {{url: ...}} maps (got {_short(endpoints)})"]
        problems = []
        for where, url in named:
            from sie.schemas.artifact_cache import safe_uri

            if not isinstance(url, str) or urlsplit(url).scheme not in ("http", "https") or not urlsplit(url).hostname:
                problems.append(f"{where}: must be an http(s) URL of a server (got {_short(url)})")
            elif urlsplit(url).username or urlsplit(url).password:
                problems.append(f"{where}: {safe_uri(url)} carries credentials in the URL; a spec is stored and shown "
                                "in clear, so keep secrets out of it")
            elif not endpoint_allowed(url, self.endpoints):
                allowed = ", ".join(self.endpoints) or "none"
                problems.append(f"{where}: {safe_uri(url)} is not under this node's LLM endpoints ({allowed}); list "
                                "the server in SIE_SGLANG_ENDPOINTS on every node, or leave endpoints out to have "
                                "each replica start its own SGLang server")
        return problems

    def check_path(self, value: Any, path: str) -> list[str]:
        """An absolute path without ``..`` that resolves (symlinks followed) under a model root."""
        text = str(value)
        if "\x00" in text:
            return [f"{path}: contains a NUL byte"]
        candidate = Path(text).expanduser()
        if not candidate.is_absolute():
            return [f"{path}: must be an absolute path on the node, or relative to the spec file when applied "
                    f"from a file (got {_short(text)})"]
        if ".." in candidate.parts:
            return [f"{path}: must not contain '..' (got {_short(text)})"]
        real = _real(candidate)
        if not any(_within(real, root) for root in self.model_roots):
            roots = ", ".join(str(r) for r in self.model_roots) or "none"
            return [f"{path}: {real} is outside this node's model roots ({roots}); put the artifact under one "
                    "or set SIE_MODEL_ROOTS"]
        return []

    def check_uri(self, uri: str, path: str) -> list[str]:
        """A ``file://`` URI under a model root; any other under an allowed source prefix."""
        from sie.schemas.artifact_cache import safe_uri

        parts = urlsplit(uri)
        if parts.scheme == "file":
            if parts.netloc not in ("", "localhost"):
                return [f"{path}: a file:// URI names a path on the node, not a host (got {safe_uri(uri)!r})"]
            return self.check_path(unquote(parts.path), path)
        if not source_allowed(uri, self.artifact_sources):
            allowed = ", ".join(self.artifact_sources) or "none"
            return [f"{path}: {safe_uri(uri)} is not under this node's artifact sources ({allowed}); set "
                    "SIE_ARTIFACT_SOURCES on every node, or upload the artifact to the cluster (sie apply)"]
        return []

    def check_upload(self, value: Any, spec_folder: Path, fmt: str | None, path: str = "spec.backend.artifact") -> list[str]:
        """What ``sie apply`` may upload from this machine: a regular file of an artifact format (its suffix one of
        ``SUFFIX_FORMATS``, agreeing with ``format``), under the spec's folder or a model root, with no dot-folder or
        dot-file on the way from that root.  Without it a spec in ``~`` naming ``.ssh/id_rsa`` with an explicit
        format uploaded the key to the cluster."""
        import stat

        from sie.schemas.spec_rules import SUFFIX_FORMATS

        real = _real(Path(str(value)).expanduser())
        roots = [r for r in (*self.model_roots, _real(spec_folder)) if _within(real, r)]
        if not roots:
            return [f"{path}: {real} is outside the spec's folder and this node's model roots; nothing else is uploaded"]
        root = max(roots, key=lambda r: len(r.parts))  # the closest root decides what counts as hidden
        hidden = [part for part in real.relative_to(root).parts if part.startswith(".")]
        if hidden:
            return [f"{path}: {real} is inside a hidden file or folder ({hidden[0]!r}) under {root}; sie apply uploads "
                    "no dot-files or dot-folders (move the artifact next to the spec)"]
        try:
            mode = os.stat(real).st_mode
        except OSError as exc:
            return [f"{path}: cannot read {real} ({exc.strerror or exc})"]
        if not stat.S_ISREG(mode):
            return [f"{path}: {real} is not a regular file; sie apply uploads only model artifact files"]
        implied = SUFFIX_FORMATS.get(real.suffix.lower())
        if implied is None:
            return [f"{path}: {real.name} is not a model artifact ({', '.join(sorted(SUFFIX_FORMATS))}); sie apply "
                    "uploads nothing else, whatever the spec's format says"]
        if fmt is not None and fmt != implied:
            return [f"{path}: {real.name} is a {implied} file by its suffix, the spec says format {fmt}"]
        return []

    def search_paths(self, candidates: Iterable[Path]) -> tuple[Path, ...]:
        """The import folders of ``candidates`` that are inside a model root: a spec read from Kafka names its
        own ``source``, so its folder may only extend ``sys.path`` where this node keeps model code anyway."""
        return tuple(p for p in candidates if any(_within(_real(p), root) for root in self.model_roots))

    def enforce(self, spec: Any, source: str | None = None) -> Any:
        """``spec`` unchanged, or ``InvalidSpec`` listing every problem."""
        problems = self.check(spec)
        if problems:
            from sie.schemas.spec_rules import InvalidSpec

            raise InvalidSpec(source or spec.source or spec.name, problems)
        return spec


def _normalised_entry(entry: str) -> str:
    """One allowed server entry as ``shlex.join`` writes it, so spacing and quoting in the setting do not matter."""
    return shlex.join(shlex.split(entry))


def check_plain_data(value: Any, path: str, max_bytes: int, max_depth: int = MAX_DATA_DEPTH) -> list[str]:
    """Strings, finite numbers, booleans, null, lists and string-keyed maps, at most ``max_depth`` deep and
    ``max_bytes`` as JSON.  Walks iteratively, so no input can exhaust the stack."""
    stack: list[tuple[Any, str, int]] = [(value, path, 0)]
    seen = 0
    while stack:
        item, where, depth = stack.pop()
        seen += 1
        if seen > max_bytes:  # every item costs at least one byte of JSON: a cheap early stop
            return [f"{path}: larger than {max_bytes} bytes as JSON"]
        if depth > max_depth:
            return [f"{where}: nested deeper than {max_depth} levels"]
        if item is None or isinstance(item, (bool, int, str)):
            continue
        if isinstance(item, float):
            if not math.isfinite(item):
                return [f"{where}: must be a finite number (got {item!r})"]
            continue
        if isinstance(item, (list, tuple)):
            stack.extend((v, f"{where}[{i}]", depth + 1) for i, v in enumerate(item))
            continue
        if isinstance(item, dict):
            for k, v in item.items():
                if not isinstance(k, str):
                    return [f"{where}: keys must be strings (got {type(k).__name__})"]
                stack.append((v, f"{where}.{k}", depth + 1))
            continue
        return [f"{where}: must be plain data (string, number, boolean, null, list or map), "
                f"got {type(item).__name__}"]
    size = len(json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode())
    if size > max_bytes:
        return [f"{path}: {size} bytes as JSON, more than {max_bytes}"]
    return []


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."

