"""Hole 6: ``moduleClass`` could name any callable of an allowed module, and it was CALLED before the ``nn.Module``
type check (``models.fraud.train:main`` with ``moduleKwargs`` ran a training run and wrote files; ``make_dataset
(n=1e10)`` is a memory bomb).  The python backend's ``callable`` likewise could be a class, constructed per batch.
Now each is type-checked before anything calls it.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from sie.workers.backends import create_backend
from sie.workers.backends.base import BackendConfig, BackendError, FieldRef
from tests.support.helpers import EXAMPLES

WEIGHTS = EXAMPLES / "models" / "fraud" / "fraud_scorer.safetensors"
HOSTILE = '''
from pathlib import Path

import torch


def main(marker: str = "") -> None:          # what models.fraud.train:main is: a function with side effects
    Path(marker).write_text("ran")


class Builder:                               # a class whose construction runs code
    def __init__(self, batch=None, marker: str = "") -> None:
        Path(marker or "/dev/null").write_text("constructed") if marker else None


class Net(torch.nn.Module):
    pass
'''


@pytest.fixture()
def package(tmp_path: Path) -> Path:
    root = tmp_path / "code"
    (root / "zhostile").mkdir(parents=True)
    (root / "zhostile" / "__init__.py").write_text("")
    (root / "zhostile" / "mod.py").write_text(HOSTILE)
    yield root
    for name in [m for m in sys.modules if m == "zhostile" or m.startswith("zhostile.")]:
        del sys.modules[name]


def _torch(package: Path, module_class: str, **kwargs: object) -> BackendConfig:
    return BackendConfig(type="torch", artifact=WEIGHTS, format="safetensors", module_class=module_class,
                         module_kwargs=kwargs, model_id="m:1", search_paths=(package,), allowed_modules=("zhostile",),
                         input_fields=(FieldRef("amount", "float"),), output_fields=(FieldRef("score", "float"),))


def test_a_module_class_that_is_a_function_is_refused_before_it_runs(package: Path, tmp_path: Path):
    marker = tmp_path / "main-ran"
    with pytest.raises(BackendError, match=r"zhostile.mod:main is a function, not a torch.nn.Module subclass"):
        create_backend(_torch(package, "zhostile.mod:main", marker=str(marker))).load()
    assert not marker.exists()


def test_a_module_class_that_is_a_class_but_no_module_is_refused_before_it_is_constructed(package: Path, tmp_path: Path):
    marker = tmp_path / "built"
    with pytest.raises(BackendError, match=r"zhostile.mod:Builder is a type, not a torch.nn.Module subclass"):
        create_backend(_torch(package, "zhostile.mod:Builder", marker=str(marker))).load()
    assert not marker.exists()


def test_a_python_callable_that_is_a_class_is_refused_before_any_batch_constructs_it(package: Path):
    config = BackendConfig(type="python", callable="zhostile.mod:Builder", model_id="m:1", search_paths=(package,),
                           allowed_modules=("zhostile",), output_fields=(FieldRef("score", "float"),),
                           example_input={"amount": 1.0})
    with pytest.raises(BackendError, match=r"zhostile.mod:Builder is a class, not a function; name a function"):
        create_backend(config).load()
