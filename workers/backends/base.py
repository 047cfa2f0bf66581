"""The backend contract: what a scorer needs from "a model", whatever runs it.

A backend turns a batch of validated input dicts into one output dict per input, in the same order. The scorer
owns batching, validation, Kafka and dead-lettering; a backend only loads, warms up and runs the model. Backends
are plain independent objects (no module-level caches keyed by model name) so that one scorer can host two versions
of the same model side by side (its routing table allows it; nothing builds such a rollout yet).

Error split, which the scorer relies on:
  * ``BackendError`` (a ``SieError``): the model cannot be served at all (bad artifact, wrong output arity,
    unavailable device). Raised by ``load()``; the message names the artifact and the fix.
  * ``InferenceError``: this batch failed (a non-numeric value, a callable that returned the wrong number of
    rows). Raised by ``infer()``; the scorer dead-letters the batch with reason ``inference_error``.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Protocol, runtime_checkable

from sie.kernel.errors import SieError
from sie.kernel.settings import DEFAULT_ALLOWED_MODULES
from sie.schemas.spec_policy import module_allowed


class BackendError(SieError):
    """The model cannot be loaded or served; the message names the artifact/callable and the fix."""


class InferenceError(Exception):
    """One batch failed inside the backend; the scorer dead-letters it with reason ``inference_error``."""


@dataclass(frozen=True)
class FieldRef:
    """A schema field as a backend sees it: a name and one of ``string|int|float|bool``."""

    name: str
    type: str


def _frozen_mapping(value: Mapping[str, Any] | None) -> Mapping[str, Any]:
    return MappingProxyType(dict(value or {}))


@dataclass(frozen=True)
class BackendConfig:
    """Everything a backend needs, decoupled from the spec model so backends can be built in tests directly.

    ``input_fields``/``output_fields`` keep the schema ORDER: the torch backend maps them to tensor columns.
    ``search_paths`` are directories tried (temporarily) on ``sys.path`` when importing ``module_class`` or
    ``callable``: the spec file's directory and its ancestors, so a model package next to the spec imports.
    ``allowed_modules``: the module prefixes ``module_class``/``callable`` may come from (the node's
    ``SIE_ALLOWED_MODULES``); nothing outside them is imported, whatever built this config.
    ``modules_path``: the verified archive of the spec's own package (``backend.modules``, fetched by the
    agent): when set, ``module_class``/``callable`` are imported from it and from nowhere else.
    """

    type: str
    artifact: Path | None = None
    format: str | None = None
    module_class: str | None = None
    module_kwargs: Mapping[str, Any] = field(default_factory=dict)
    callable: str | None = None
    model_path: str | None = None
    config: Mapping[str, Any] = field(default_factory=dict)
    device: str = "auto"
    input_fields: tuple[FieldRef, ...] = ()
    output_fields: tuple[FieldRef, ...] = ()
    example_input: Mapping[str, Any] | None = None
    model_id: str = "<model>"
    search_paths: tuple[Path, ...] = ()
    allowed_modules: tuple[str, ...] = DEFAULT_ALLOWED_MODULES
    modules_path: Path | None = None

    def __post_init__(self) -> None:
        # Freeze the mappings too: a config shared by two backend instances must not be mutated by either.
        object.__setattr__(self, "module_kwargs", _frozen_mapping(self.module_kwargs))
        object.__setattr__(self, "config", _frozen_mapping(self.config))
        if self.example_input is not None:
            object.__setattr__(self, "example_input", _frozen_mapping(self.example_input))
        if self.artifact is not None and not isinstance(self.artifact, Path):
            object.__setattr__(self, "artifact", Path(self.artifact))
        object.__setattr__(self, "input_fields", tuple(self.input_fields))
        object.__setattr__(self, "output_fields", tuple(self.output_fields))
        object.__setattr__(self, "search_paths", tuple(Path(p) for p in self.search_paths))

    def warmup_input(self) -> dict[str, Any]:
        """The spec's example input, or a neutral row (0 / 0.0 / False / "") when the spec has none."""
        if self.example_input is not None:
            return dict(self.example_input)
        neutral = {"int": 0, "float": 0.0, "bool": False, "string": ""}
        return {f.name: neutral.get(f.type, 0) for f in self.input_fields}


@runtime_checkable
class Backend(Protocol):
    """What the scorer calls. ``infer`` is called from one thread at a time per backend instance."""

    device: str

    def load(self) -> None:
        """Load the model and run one warm-up inference; raise ``BackendError`` if it cannot be served."""

    def infer(self, inputs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """One output dict per input, same order; raise ``InferenceError`` if the batch fails."""

    def close(self) -> None:
        """Release the model (and GPU memory); idempotent."""


# --- registry ------------------------------------------------------------------------------------------------

BackendFactory = Callable[[BackendConfig], Backend]
_REGISTRY: dict[str, BackendFactory] = {}


def register_backend(type_name: str, factory: BackendFactory) -> None:
    """Register a backend type (``torch``/``python`` here; ``sglang`` registers itself from its own module)."""
    _REGISTRY[type_name] = factory


def registered_backends() -> tuple[str, ...]:
    return tuple(sorted(_REGISTRY))


def create_backend(config: BackendConfig) -> Backend:
    """A new, unloaded backend for ``config`` (call ``load()`` next). Unknown type -> ``BackendError``."""
    factory = _REGISTRY.get(config.type)
    if factory is None:
        raise BackendError(
            f"{config.model_id}: spec.backend.type {config.type!r} has no backend on this worker "
            f"(available: {', '.join(registered_backends()) or 'none'}); for sglang install the extra: "
            f"pip install 'sie[sglang]'"
        )
    return factory(config)


# --- spec -> config -------------------------------------------------------------------------------------------


def _field_refs(schema: Any) -> tuple[FieldRef, ...]:
    fields = getattr(schema, "fields", None) or ()
    return tuple(FieldRef(name=str(f.name), type=str(getattr(f, "type", "float"))) for f in fields)


def _spec_dir(spec: Any) -> Path | None:
    for attr in ("base_dir", "source"):
        value = getattr(spec, attr, None)
        if not value or str(value).startswith("<"):
            continue
        path = Path(value)
        return path if attr == "base_dir" or path.is_dir() else path.parent
    return None


def backend_config_from_spec(spec: Any, policy: Any = None) -> BackendConfig:
    """Project a ``sie.schemas.spec.ModelService`` onto a ``BackendConfig``.

    ``policy`` (a ``sie.schemas.spec_policy.SpecPolicy``): the node's allowed modules, and the import
    folders derived from the spec's ``source`` kept only inside its model roots (a spec read from
    Kafka chooses its own ``source``). Without one, the defaults: the demo's modules only.
    Tolerant (``getattr`` with defaults) so it accepts any spec-shaped object, e.g. a test double.
    """
    backend = spec.backend
    spec_dir = _spec_dir(spec)
    search_paths: list[Path] = []
    if spec_dir is not None:
        spec_dir = spec_dir.resolve()
        search_paths = [spec_dir, *spec_dir.parents]
    if policy is not None:
        search_paths = list(policy.search_paths(search_paths))
    example = getattr(spec, "example_input", None)
    model_id = getattr(spec, "model_id", None) or getattr(spec, "name", None) or "<model>"
    return BackendConfig(
        type=str(backend.type),
        artifact=getattr(backend, "artifact", None),
        format=getattr(backend, "format", None),
        module_class=getattr(backend, "module_class", None),
        module_kwargs=getattr(backend, "module_kwargs", None) or {},
        callable=getattr(backend, "callable", None),
        model_path=getattr(backend, "model_path", None),
        config=getattr(backend, "config", None) or {},
        device=getattr(backend, "device", None) or "auto",
        input_fields=_field_refs(getattr(spec, "input_schema", None)),
        output_fields=_field_refs(getattr(spec, "output_schema", None)),
        example_input=dict(example) if example is not None else None,
        model_id=str(model_id),
        search_paths=tuple(search_paths),
        allowed_modules=tuple(policy.allowed_modules) if policy is not None else DEFAULT_ALLOWED_MODULES,
        modules_path=getattr(backend, "modules_path", None),
    )


# --- shared helper: "package.module:attr" imports -------------------------------------------------------------


def _import_near(module_name: str, search_paths: Iterable[Path], what: str) -> Any:
    top = module_name.split(".")[0]
    extra: str | None = None
    for directory in search_paths:
        if (directory / top).is_dir() or (directory / f"{top}.py").is_file():
            extra = str(directory)
            break
    added = extra is not None and extra not in sys.path
    if added:
        sys.path.insert(0, extra)  # type: ignore[arg-type]
    try:
        return importlib.import_module(module_name)
    except Exception as exc:
        raise BackendError(
            f"{what}: cannot import module {module_name!r} ({type(exc).__name__}: {exc}); make it importable "
            f"from the spec's directory or an installed package"
        ) from exc
    finally:
        if added:
            try:
                sys.path.remove(extra)  # type: ignore[arg-type]
            except ValueError:
                pass


def _from_bundle(module: Any, archive: str) -> bool:
    origin = getattr(module, "__file__", None)
    return isinstance(origin, str) and origin.startswith(archive + "/")


def _import_from_bundle(module_name: str, bundle: Path, what: str) -> Any:
    archive = str(bundle)
    parts = module_name.split(".")
    for depth in range(1, len(parts) + 1):  # a package of that name loaded from elsewhere would shadow ours
        loaded = sys.modules.get(".".join(parts[:depth]))
        if loaded is not None and not _from_bundle(loaded, archive):
            raise BackendError(f"{what}: module {'.'.join(parts[:depth])!r} is already loaded from "
                               f"{getattr(loaded, '__file__', None) or 'this environment'}, not from the spec's "
                               f"modules ({bundle.name}); rename the model's package")
    if archive not in sys.path:
        sys.path.insert(0, archive)
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise BackendError(f"{what}: cannot import module {module_name!r} from the spec's modules "
                           f"({bundle.name}): {type(exc).__name__}: {exc}") from exc
    if not _from_bundle(module, archive):
        raise BackendError(f"{what}: module {module_name!r} was found outside the spec's modules "
                           f"({getattr(module, '__file__', None)}); refused")
    return module


def import_object(ref: str, search_paths: Iterable[Path] = (), what: str = "spec.backend.callable",
                  allowed_modules: Iterable[str] = DEFAULT_ALLOWED_MODULES, bundle: Path | None = None) -> Any:
    """Import ``package.module:attr``, only from ``allowed_modules`` (the last line of defence: the spec
    policy already refused anything else wherever the spec was read).

    Refused before anything is imported: a module outside the allow-list, a ``__dunder`` attribute.
    Refused after: an attribute path that steps through a module outside the allow-list, or an object
    defined outside it (``allowed.mod:Popen`` where ``allowed.mod`` did ``from subprocess import Popen``).
    Only the first directory in ``search_paths`` that actually contains the top-level package (``pkg/`` or
    ``pkg.py``) is put on ``sys.path``, and only for the duration of the import: model code next to a spec
    imports without the spec's whole directory tree shadowing installed packages afterwards.

    ``bundle`` (a verified module archive, ``sie.schemas.module_bundle``): the module is imported from it and
    from nowhere else: ``search_paths`` are ignored, a module of that name already loaded from elsewhere
    is refused, and the imported module must come from the archive.  The archive stays first on ``sys.path``
    (a worker serves one model: its code's own lazy imports keep working).
    """
    import types

    allowed = tuple(allowed_modules)
    module_name, sep, attr = ref.partition(":")
    if not sep or not module_name or not attr:
        raise BackendError(f"{what}: {ref!r} is not of the form 'package.module:name' (e.g. 'models.fraud.rules:score')")
    if any(part.startswith("__") for part in attr.split(".")):
        raise BackendError(f"{what}: {ref!r} reaches a __dunder__ attribute; name a class or function of the module")
    if not module_allowed(module_name, allowed):
        raise BackendError(f"{what}: module {module_name!r} is not in this node's allowed modules "
                           f"({', '.join(allowed) or 'none'}); set SIE_ALLOWED_MODULES to allow your model package")
    if bundle is not None:
        module = _import_from_bundle(module_name, Path(bundle), what)
    else:
        module = _import_near(module_name, search_paths, what)
    try:
        obj = module
        for part in attr.split("."):
            obj = getattr(obj, part)
            if isinstance(obj, types.ModuleType) and not module_allowed(obj.__name__, allowed):
                raise BackendError(f"{what}: {ref!r} steps into module {obj.__name__!r}, outside the allowed modules")
    except AttributeError as exc:
        raise BackendError(f"{what}: module {module_name!r} has no attribute {attr!r}; check the name after ':'") from exc
    defined_in = getattr(obj, "__module__", None)
    if isinstance(obj, types.ModuleType) or not isinstance(defined_in, str) or not module_allowed(defined_in, allowed):
        raise BackendError(f"{what}: {ref!r} is defined in {defined_in or 'an unknown module'!r}, outside the allowed "
                           f"modules ({', '.join(allowed) or 'none'}); name code of your model package itself")
    return obj
