"""A user's own model project, as a new user writes it: specs next to their own packages and weights.

What the rollout tests need and the demo package cannot give: DIFFERENT CODE per version, uploaded by
``sie apply`` (the package next to the spec is zipped and named by sha256, the weights too), and outputs that
say which code answered, so every committed result's ``version`` label can be checked against the code that
produced it.  Three kinds, one spec file per version:

* ``churn-py``  python backend, ``churnpkg.rules:score``: ``{"churn": ..., "built": "<version>"}``.  Both
  versions are the SAME package name (``churnpkg``) with different code, and ``score`` imports
  ``churnpkg.helpers`` lazily inside the function: one interpreter would serve both versions with one module.
* ``churn-net`` torch backend, safetensors weights + ``moduleClass: churnnet.model:ChurnNet``: outputs
  ``churn`` and ``code`` (= the version's number, written into its weights and its code).
* ``churn-ts``  torch backend, a TorchScript artifact per version: outputs ``churn`` and ``code``.

``version_code("1.1.0") == 1.1`` is what ``code`` says for a version; a broken version (``broken=True``)
names a callable that does not exist (it cannot load); a hanging one (``hang=True``) never answers a request
but the example (it passes readiness).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

#: the package names the nodes must allow (SIE_ALLOWED_MODULES) for these projects
ALLOWED_MODULES = "churnpkg,churnnet"
FEATURES = ("tenure", "spend", "tickets")


def version_code(version: str) -> float:
    """``1.1.0`` -> 1.1: what a version's code reports in its ``code`` output."""
    major, minor = version.split(".")[:2]
    return float(f"{major}.{minor}")


def _schemas(outputs: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "inputSchema": {"type": "json", "unknownFields": "ignore",
                        "fields": [{"name": f, "type": "float", "range": [0, 1000]} for f in FEATURES]},
        "outputSchema": {"type": "json", "fields": outputs},
        "exampleInput": {"tenure": 12.0, "spend": 80.0, "tickets": 1.0},
    }


def _spec(name: str, version: str, backend: dict[str, Any], outputs: list[dict[str, Any]],
          rollout: dict[str, Any] | None, replicas: int) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "model": {"name": name, "version": version},
        "priorityLevel": "P1",
        "serviceType": "scoring",
        "backend": backend,
        "resources": {"gpuMemoryMb": 0, "cpu": 0.25, "memoryMb": 256},
        "sla": {"p99_latency_ms": 5000, "max_queue_time_ms": 600000, "min_replicas": replicas,
                "max_replicas": replicas},
        **_schemas(outputs),
    }
    if rollout is not None:
        spec["rollout"] = rollout
    return {"apiVersion": "sie.lmsys.org/v1", "kind": "ModelService", "metadata": {"name": name}, "spec": spec}


def python_project(root: Path, version: str, *, broken: bool = False, hang: bool = False,
                   rollout: dict[str, Any] | None = None, name: str = "churn-py", replicas: int = 1,
                   load_s: float = 0.0, fails_one_in: int = 0) -> Path:
    """``root/<version>/``: ``churnpkg`` (this version's code) and ``churn-py.yaml``; returns the spec file.
    ``load_s``: the model takes this long to load (its module sleeps when imported), as a worker and as a
    companion process.  ``fails_one_in``: a bad version that cannot score 1 row in N (``int(tenure) % N == 3``;
    not its readiness example, tenure 12, so it loads and passes readiness like a good one)."""
    folder = root / version
    pkg = folder / "churnpkg"
    pkg.mkdir(parents=True, exist_ok=True)
    (pkg / "__init__.py").write_text(f'BUILT = "{version}"\n', encoding="utf-8")
    (pkg / "helpers.py").write_text(f"def weight():\n    return {version_code(version)!r}\n", encoding="utf-8")
    # the hanging version's stuck call: the model's own behaviour under test, not a synchronisation
    hang_code = ("    import time\n    if any(r['tickets'] != 1.0 for r in rows):\n        time.sleep(600)\n"
                 if hang else "")
    fail_code = (f"    if any(int(r['tenure']) % {fails_one_in} == 3 for r in rows):\n"
                 "        raise ValueError('this version cannot score this row')\n" if fails_one_in else "")
    slow = f"import time\ntime.sleep({load_s!r})  # a model that takes long to load\n" if load_s else ""
    (pkg / "rules.py").write_text(
        f"{slow}from churnpkg import BUILT\n\n\n"
        "def score(rows):\n"
        f"{hang_code}{fail_code}"
        "    from churnpkg.helpers import weight  # imported lazily, inside the call\n"
        "    return [{'churn': min(1.0, r['tenure'] / 1000.0), 'built': BUILT, 'weight': weight()} for r in rows]\n",
        encoding="utf-8")
    backend = {"type": "python", "callable": "churnpkg.rules:" + ("no_such_scorer" if broken else "score")}
    outputs = [{"name": "churn", "type": "float", "range": [0, 1]}, {"name": "built", "type": "string"},
               {"name": "weight", "type": "float"}]
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(_spec(name, version, backend, outputs, rollout, replicas), sort_keys=False),
                    encoding="utf-8")
    return path


_NET = '''import torch


class ChurnNet(torch.nn.Module):
    """{version}: churn = sigmoid(linear(x)); code = this version's number, a literal of this code."""

    def __init__(self, inputs: int = 3) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(inputs, 1)
        self.stamp = torch.nn.Parameter(torch.zeros(1), requires_grad=False)

    def forward(self, x):
        churn = torch.sigmoid(self.linear(x) / 100.0)
        code = torch.full((x.shape[0], 1), {code!r}) + 0.0 * self.stamp
        return torch.cat([churn, code], dim=1)
'''


def _net_module(version: str) -> Any:
    import importlib.util
    import sys
    import tempfile

    source = _NET.format(version=version, code=version_code(version))
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(source)
    spec = importlib.util.spec_from_file_location(f"_churnnet_{version.replace('.', '_')}", f.name)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module, source


def _trained(version: str) -> Any:
    import torch

    module, source = _net_module(version)
    torch.manual_seed(int(version_code(version) * 10))
    net = module.ChurnNet()
    with torch.no_grad():
        net.stamp.fill_(version_code(version))
    return net.eval(), source


def torch_module_project(root: Path, version: str, *, broken: bool = False, rollout: dict[str, Any] | None = None,
                         name: str = "churn-net", replicas: int = 1) -> Path:
    """``root/<version>/``: ``churnnet/model.py`` (this version's code), its safetensors weights, the spec."""
    from safetensors.torch import save_file

    folder = root / version
    pkg = folder / "churnnet"
    pkg.mkdir(parents=True, exist_ok=True)
    net, source = _trained(version)
    (pkg / "__init__.py").write_text("", encoding="utf-8")
    (pkg / "model.py").write_text(source, encoding="utf-8")
    save_file({k: v.contiguous() for k, v in net.state_dict().items()}, str(folder / "churn.safetensors"))
    backend = {"type": "torch", "artifact": "churn.safetensors",
               "moduleClass": "churnnet.model:" + ("NoSuchNet" if broken else "ChurnNet"), "device": "cpu",
               "config": {"threads": 1}}
    outputs = [{"name": "churn", "type": "float", "range": [0, 1]}, {"name": "code", "type": "float"}]
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(_spec(name, version, backend, outputs, rollout, replicas), sort_keys=False),
                    encoding="utf-8")
    return path


def torchscript_project(root: Path, version: str, *, rollout: dict[str, Any] | None = None, name: str = "churn-ts",
                        replicas: int = 1) -> Path:
    """``root/<version>/``: a TorchScript artifact of this version and the spec (no code of its own)."""
    import torch

    folder = root / version
    folder.mkdir(parents=True, exist_ok=True)
    net, _source = _trained(version)
    torch.jit.script(net).save(str(folder / "churn.pt"))
    backend = {"type": "torch", "artifact": "churn.pt", "device": "cpu", "config": {"threads": 1}}
    outputs = [{"name": "churn", "type": "float", "range": [0, 1]}, {"name": "code", "type": "float"}]
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(_spec(name, version, backend, outputs, rollout, replicas), sort_keys=False),
                    encoding="utf-8")
    return path


def requests(n: int, prefix: str = "r") -> list[tuple[bytes, bytes]]:
    """``n`` (key, value) requests with features in range; keys repeat over 97 customers (stickiness)."""
    import orjson

    out = []
    for i in range(n):
        doc = {"id": f"{prefix}{i}", "inputs": {"tenure": float(i % 500), "spend": float(i % 300), "tickets": 2.0}}
        out.append((f"cust-{i % 97}".encode(), orjson.dumps(doc)))
    return out
