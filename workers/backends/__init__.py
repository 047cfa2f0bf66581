"""Model backends behind one small interface (see ``base.py``).

    from sie.workers.backends import backend_config_from_spec, create_backend
    backend = create_backend(backend_config_from_spec(spec)); backend.load(); backend.infer([...])

``torch`` is imported only when a torch backend is created, so python-backend scorers start fast. The sglang
backend registers itself (``register_backend("sglang", ...)``) from its own module.
"""

from sie.workers.backends.base import (
    Backend,
    BackendConfig,
    BackendError,
    FieldRef,
    InferenceError,
    backend_config_from_spec,
    create_backend,
    import_object,
    register_backend,
    registered_backends,
)
from sie.workers.backends.python_backend import PythonBackend


def _torch_backend(config: BackendConfig) -> Backend:
    from sie.workers.backends.torch_backend import TorchBackend

    return TorchBackend(config)


def _sglang_backend(config: BackendConfig) -> Backend:
    from sie.workers.backends.sglang_backend import SGLangBackend  # HTTP client only: no sglang/CUDA import here

    return SGLangBackend(config)


register_backend("torch", _torch_backend)
register_backend("python", PythonBackend)
register_backend("sglang", _sglang_backend)

__all__ = [
    "Backend",
    "BackendConfig",
    "BackendError",
    "FieldRef",
    "InferenceError",
    "PythonBackend",
    "backend_config_from_spec",
    "create_backend",
    "import_object",
    "register_backend",
    "registered_backends",
]
