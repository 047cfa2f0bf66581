"""PyTorch backend: TorchScript, torch.export archives, or safetensors weights + a module class.

SIE never unpickles a model file (a pickle can run arbitrary code when loaded). So before handing a file to
torch, this module checks what it is:
  * TorchScript (``.pt``/``.ts``): must be a TorchScript zip (``code/`` + ``constants.pkl``). Its embedded
    pickles are read by TorchScript's own restricted C++ unpickler, which builds only TorchScript types. A
    ``torch.save`` checkpoint renamed ``.pt`` is refused with a message saying how to re-export.
  * torch.export (``.pt2``): ``torch.export.load`` falls back to ``torch.load(weights_only=False)`` for
    tensor subclasses, opaque constants and sample inputs it cannot read safely, so the archive is scanned
    first and refused if any of its payloads would need that fallback.
  * safetensors: a pure tensor format; the module class comes from ``spec.backend.module_class``.

Inference maps the input fields (schema order) to ONE float32 tensor ``[B, n_inputs]`` (bool -> 0/1), runs
one forward pass under ``torch.inference_mode()`` and maps output columns (``[B]`` or ``[B, k]``) to the
output fields in schema order.
"""

from __future__ import annotations

import io
import json
import warnings
import zipfile
from operator import itemgetter
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np
import torch

from sie.workers.backends.base import BackendConfig, BackendError, InferenceError, import_object

TENSOR_TYPES = ("int", "float", "bool")
_SUFFIX_FORMATS = {
    ".pt": "torchscript",
    ".ts": "torchscript",
    ".jit": "torchscript",
    ".torchscript": "torchscript",
    ".pt2": "export",
    ".safetensors": "safetensors",
}
_REEXPORT_HINT = (
    "re-export it with torch.jit.script(model).save(path), torch.export.save(torch.export.export(model, args), "
    "'model.pt2'), or save the weights with safetensors.torch.save_file(model.state_dict(), 'model.safetensors') "
    "and set spec.backend.module_class"
)


def resolve_device(requested: str | None) -> str:
    """``auto`` -> ``cuda:0`` when CUDA is usable, else ``cpu``; an explicit CUDA device must exist."""
    requested = (requested or "auto").strip().lower()
    if requested == "auto":
        return "cuda:0" if torch.cuda.is_available() else "cpu"
    if requested.startswith("cuda"):
        if not torch.cuda.is_available():
            raise BackendError(
                f"spec.backend.device: {requested!r} requested but CUDA is not available on this node; "
                f"use 'auto' or 'cpu', or place the model on a GPU node"
            )
        index = int(requested.split(":", 1)[1]) if ":" in requested else 0
        if index >= torch.cuda.device_count():
            raise BackendError(
                f"spec.backend.device: {requested!r} but this node has {torch.cuda.device_count()} visible GPU(s)"
            )
        return f"cuda:{index}"
    return requested


def infer_format(artifact: Path, declared: str | None) -> str:
    if declared:
        return declared
    fmt = _SUFFIX_FORMATS.get(artifact.suffix.lower())
    if fmt is None:
        raise BackendError(
            f"spec.backend.format: cannot tell the format of {artifact.name!r} from its suffix; set format to "
            f"torchscript, export or safetensors"
        )
    return fmt


# --- "is this safe to hand to torch?" checks -------------------------------------------------------------------


def _open_zip(path: Path, fmt: str) -> zipfile.ZipFile:
    with path.open("rb") as fh:
        head = fh.read(2)
    if not zipfile.is_zipfile(path):
        kind = "a raw pickle (legacy torch.save)" if head[:1] == b"\x80" else "not a zip archive"
        raise BackendError(
            f"spec.backend.artifact {path}: declared {fmt} but the file is {kind}; SIE never unpickles model "
            f"files: {_REEXPORT_HINT}"
        )
    return zipfile.ZipFile(path)


def _inner_names(archive: zipfile.ZipFile) -> list[str]:
    """Entry names without the archive's top-level folder (torch writes ``<name>/...``)."""
    return [str(PurePosixPath(*PurePosixPath(n).parts[1:])) for n in archive.namelist() if "/" in n]


def check_torchscript_archive(path: Path) -> None:
    with _open_zip(path, "torchscript") as archive:
        names = _inner_names(archive)
    if "constants.pkl" not in names or not any(n.startswith("code/") for n in names):
        raise BackendError(
            f"spec.backend.artifact {path}: not a TorchScript archive (no code/ + constants.pkl; it looks like a "
            f"torch.save() checkpoint, i.e. a pickle, which SIE never loads): {_REEXPORT_HINT}"
        )


def check_export_archive(path: Path) -> None:
    """Refuse any .pt2 whose loading would reach ``torch.load(weights_only=False)`` or ``pickle.loads``."""

    def refuse(why: str) -> BackendError:
        return BackendError(
            f"spec.backend.artifact {path}: torch.export archive {why}; loading it would unpickle arbitrary "
            f"objects, which SIE never does: export plain tensors only, or use TorchScript/safetensors"
        )

    with _open_zip(path, "export") as archive:
        full_names = archive.namelist()
        names = _inner_names(archive)
        by_inner = dict(zip(names, (n for n in full_names if "/" in n)))
        if not any(n.startswith("models/") and n.endswith(".json") for n in names):
            raise refuse("has no models/*.json (pre-2.8 format)")
        for inner, full in by_inner.items():
            if inner.startswith("data/aotinductor/"):
                raise refuse("contains an AOTInductor package")
            if inner.startswith(("data/weights/", "data/constants/")) and inner.endswith(".pt"):
                raise refuse(f"stores {inner} in the legacy pickled form")
            if inner.startswith(("data/weights/", "data/constants/")) and inner.endswith("_config.json"):
                config = json.loads(archive.read(full)).get("config", {})
                for fqn, meta in config.items():
                    if meta.get("use_pickle"):
                        raise refuse(f"pickles {fqn!r} (a tensor subclass)")
                    if inner.startswith("data/constants/") and not str(meta.get("path_name", "")).startswith("tensor_"):
                        raise refuse(f"holds a non-tensor constant {fqn!r}")
            if inner.startswith("data/sample_inputs/"):
                try:
                    torch.load(io.BytesIO(archive.read(full)), weights_only=True)
                except Exception as exc:
                    raise refuse(f"has sample inputs that are not plain tensors ({type(exc).__name__})") from exc


# --- loading --------------------------------------------------------------------------------------------------


def _load_torchscript(path: Path, device: str) -> torch.nn.Module:
    check_torchscript_archive(path)
    with warnings.catch_warnings():  # torch >= 2.9 marks torch.jit deprecated; loading is still supported
        warnings.simplefilter("ignore", FutureWarning)
        return torch.jit.load(str(path), map_location=device)


def _load_export(path: Path, device: str) -> Any:
    check_export_archive(path)
    program = torch.export.load(str(path))
    if device != "cpu":
        from torch.export.passes import move_to_device_pass

        program = move_to_device_pass(program, device)
    return program.module()


def _load_safetensors(path: Path, device: str, config: BackendConfig) -> torch.nn.Module:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    if not config.module_class:
        raise BackendError(
            f"spec.backend.module_class: required with a safetensors artifact ({path.name}); e.g. "
            f"'models.fraud.model:FraudMLP'"
        )
    cls = import_object(config.module_class, config.search_paths, what="spec.backend.module_class",
                        allowed_modules=config.allowed_modules, bundle=config.modules_path)
    # Type-checked BEFORE it is called: a spec may name any attribute of an allowed module, and calling a function
    # (``models.fraud.train:main``, ``make_dataset(n=1e10)``) would run it with the spec's moduleKwargs.
    if not (isinstance(cls, type) and issubclass(cls, torch.nn.Module)):
        raise BackendError(f"spec.backend.module_class: {config.module_class} is a {type(cls).__name__}, not a "
                           "torch.nn.Module subclass; name the model's class (e.g. 'models.fraud.model:FraudMLP')")
    try:
        module = cls(**dict(config.module_kwargs))
    except Exception as exc:
        raise BackendError(
            f"spec.backend.module_class: {config.module_class}(**{dict(config.module_kwargs)}) failed "
            f"({type(exc).__name__}: {exc}); check spec.backend.module_kwargs"
        ) from exc
    try:
        state = load_file(str(path), device="cpu")
    except (SafetensorError, OSError, ValueError) as exc:
        raise BackendError(f"spec.backend.artifact {path}: not a readable safetensors file ({exc})") from exc
    try:
        module.load_state_dict(state, strict=True)
    except RuntimeError as exc:
        detail = " ".join(str(exc).split())
        raise BackendError(
            f"spec.backend.artifact {path}: weights do not fit {config.module_class} ({detail}); check "
            f"module_class/module_kwargs match the saved model"
        ) from exc
    return module.to(device)


def _eval_mode(module: Any) -> None:
    try:
        module.eval()
    except Exception:  # exported GraphModules may refuse .eval(); they are already in inference form
        pass


class TorchBackend:
    """One loaded torch model; independent of any other instance (two versions can share a process)."""

    def __init__(self, config: BackendConfig) -> None:
        self.config = config
        self.device = "cpu"
        self.format: str | None = None
        self._module: Any = None
        self._input_names = tuple(f.name for f in config.input_fields)
        self._output_fields = config.output_fields
        self._row = self._row_getter(self._input_names)

    @staticmethod
    def _row_getter(names: tuple[str, ...]):
        if len(names) == 1:
            only = names[0]
            return lambda row: (row[only],)
        return itemgetter(*names)

    # -- lifecycle --

    def load(self) -> None:
        cfg = self.config
        where = f"{cfg.model_id}"
        if cfg.artifact is None:
            raise BackendError(f"{where}: spec.backend.artifact is required for a torch backend")
        path = Path(cfg.artifact)
        if not path.is_file():
            raise BackendError(
                f"{where}: spec.backend.artifact {path} does not exist; paths are relative to the spec file "
                f"(for the demo, run: cd examples && python -m models.fraud.train)"
            )
        self._check_fields()
        self.device = resolve_device(cfg.device)
        threads = int(cfg.config.get("threads", 1))
        if threads >= 1:
            torch.set_num_threads(threads)  # one scorer process per model: few threads avoid oversubscription
        self.format = infer_format(path, cfg.format)
        if self.format == "torchscript":
            module = _load_torchscript(path, self.device)
        elif self.format == "export":
            module = _load_export(path, self.device)
        elif self.format == "safetensors":
            module = _load_safetensors(path, self.device, cfg)
        else:
            raise BackendError(
                f"{where}: spec.backend.format {self.format!r} is not one of torchscript, export, safetensors"
            )
        _eval_mode(module)
        self._module = module
        self._warm_up(path)

    def _check_fields(self) -> None:
        cfg = self.config
        if not cfg.input_fields:
            raise BackendError(f"{cfg.model_id}: spec.inputSchema.fields is empty; the torch backend needs the input columns in order")
        if not cfg.output_fields:
            raise BackendError(f"{cfg.model_id}: spec.outputSchema.fields is empty; name the model's output columns")
        for where, fields in (("inputSchema", cfg.input_fields), ("outputSchema", cfg.output_fields)):
            for f in fields:
                if f.type not in TENSOR_TYPES:
                    raise BackendError(
                        f"{cfg.model_id}: spec.{where} field {f.name!r} has type {f.type!r}, which the torch "
                        f"backend cannot map to a tensor column; use int/float/bool, or a python backend"
                    )

    def _warm_up(self, path: Path) -> None:
        """Two identical rows, then one: the first real forward passes, the check that the output shape fits
        the schema, and that the batch dimension is not fixed (a .pt2 exported without a dynamic one)."""
        row = self.config.warmup_input()
        for batch in (2, 1):
            try:
                out = self._forward([row] * batch)
            except InferenceError as exc:
                hint = ""
                if self.format == "export":  # the usual cause: a fixed batch size (Guard failed: x.size()[0] == 1)
                    hint = ("; a .pt2 must be exported with a dynamic batch dimension: torch.export.export(model, "
                            "(x,), dynamic_shapes={'x': {0: torch.export.Dim('batch')}}) (docs/backends.md)")
                raise BackendError(
                    f"{self.config.model_id}: warm-up inference on {path.name} failed: {exc}{hint}") from exc
            self._columns(out, batch, on_error=BackendError)

    def close(self) -> None:
        module, self._module = self._module, None
        del module
        if self.device.startswith("cuda"):
            torch.cuda.empty_cache()

    # -- inference --

    def _forward(self, inputs: list[dict[str, Any]]) -> Any:
        if self._module is None:
            raise InferenceError(f"{self.config.model_id}: backend is not loaded (call load() first)")
        try:
            matrix = np.asarray(list(map(self._row, inputs)), dtype=np.float32)
        except KeyError as exc:
            raise InferenceError(f"{self.config.model_id}: an input row has no field {exc.args[0]!r}") from exc
        except (TypeError, ValueError) as exc:
            raise InferenceError(f"{self.config.model_id}: {self._describe_bad_value(inputs)} ({exc})") from exc
        x = torch.from_numpy(matrix)
        if self.device != "cpu":
            x = x.to(self.device, non_blocking=True)
        try:
            with torch.inference_mode():
                return self._module(x)
        except Exception as exc:
            raise InferenceError(
                f"{self.config.model_id}: forward pass failed on input [{len(inputs)}, {len(self._input_names)}] "
                f"({type(exc).__name__}: {' '.join(str(exc).split())[:300]})"
            ) from exc

    def _describe_bad_value(self, inputs: list[dict[str, Any]]) -> str:
        for i, row in enumerate(inputs):
            for name in self._input_names:
                value = row[name]
                if not isinstance(value, (bool, int, float)):
                    return f"inputs[{i}].{name}: not a number (got {value!r})"
        return "an input value is not a number"

    def _columns(self, out: Any, batch: int, on_error: type[Exception] = InferenceError) -> np.ndarray:
        """Model output -> float array [B, k] matching the output fields, or ``on_error`` naming the shapes."""
        names = [f.name for f in self._output_fields]
        if isinstance(out, (tuple, list)) and len(out) == 1:
            out = out[0]
        if not isinstance(out, torch.Tensor):
            raise on_error(
                f"{self.config.model_id}: model returned {type(out).__name__}; expected a tensor [B] or [B, "
                f"{len(names)}] for output fields {names}"
            )
        shape = tuple(out.shape)
        k = len(names)
        if shape == (batch,) and k == 1:
            arr = out.reshape(batch, 1)
        elif len(shape) == 2 and shape == (batch, k):
            arr = out
        else:
            raise on_error(
                f"{self.config.model_id}: model output shape {list(shape)} for a batch of {batch} does not match "
                f"the {k} output field(s) {names}; expected [{batch}] (one field) or [{batch}, {k}]: fix "
                f"spec.outputSchema.fields or the model"
            )
        return arr.detach().to(device="cpu", dtype=torch.float32).numpy()

    def infer(self, inputs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        if not inputs:
            return []
        batch = len(inputs)
        cols = self._columns(self._forward(inputs), batch)
        if not np.isfinite(cols).all():
            bad = sorted({int(i) for i in np.nonzero(~np.isfinite(cols))[0]})[:5]
            raise InferenceError(f"{self.config.model_id}: model produced NaN/inf for input rows {bad}")
        columns = []
        for j, f in enumerate(self._output_fields):
            col = cols[:, j]
            if f.type == "int":
                columns.append(np.rint(col).astype(np.int64).tolist())
            elif f.type == "bool":
                columns.append((col >= 0.5).tolist())
            else:
                columns.append(col.tolist())
        names = [f.name for f in self._output_fields]
        if len(names) == 1:
            only = names[0]
            return [{only: v} for v in columns[0]]
        return [dict(zip(names, values)) for values in zip(*columns)]
