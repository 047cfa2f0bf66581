"""A control API served over HTTP without Kafka, for browser tests of the status page: one applied model,
``churn``, in the middle of a rollout (1.0.0 -> 1.1.0, ``Canary(step 1/2, 50%)``), its state set directly
as in tests/control/rollout/test_rollout_api.  ``seen`` records every request's path, query and
``Authorization`` header (what a test may assert about tokens on the wire and in URLs)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tests.support.helpers import OPERATOR_TOKEN, with_api_tokens
from tests.support.scorer_fixtures import ALLOWED_MODULES, echo_spec_doc

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
#: the flags a headless Chromium needs on these machines (no sandbox as root; no calls home)
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]


class _Leader:
    is_leader = True
    epoch = 1  # the rollouts are loaded once per leader epoch (rollout_service.Rollouts)


class _Published:
    def __init__(self) -> None:
        self.records: list[Any] = []

    def publish(self, records: Any) -> None:
        self.records += records


class _Audit:
    def record(self, *_args: Any) -> None:
        pass


@dataclass
class ServedControl:
    url: str
    service: Any
    seen: list[tuple[str, str, str | None]] = field(default_factory=list)


@contextmanager
def served_control(tmp_path: Path) -> Iterator[ServedControl]:
    import httpx
    from prometheus_client import CollectorRegistry

    from sie.control.api.auth import TokenStore
    from sie.control.api.routes import create_app
    from sie.control.api.server import ApiServer
    from sie.control.rollout.service import Rollouts
    from sie.control.service import ControlService
    from sie.kernel.settings import Settings
    from sie.schemas.spec import load

    settings = with_api_tokens(Settings(cache_dir=tmp_path / "cache", allowed_modules=list(ALLOWED_MODULES)))
    service = ControlService(settings, http_port=None)
    service.registry = CollectorRegistry()
    service.rollouts = Rollouts(settings, _Leader(), _Published(), reader=lambda _s: [], registry=service.registry)
    service.rollouts.tick()  # leads: resumes (nothing stored) and drives
    doc = echo_spec_doc("churn")
    stable = load(doc)
    service.state.apply_spec("churn", {"name": "churn", "version": "1.0.0", "spec_json": json.dumps(stable.to_document()),
                                       "applied_at_ms": 1, "deleted": False})
    app = create_app(service, TokenStore(settings), (), _Audit())
    served = ServedControl("", service)

    @app.middleware("http")
    async def record(request: Any, call_next: Any) -> Any:
        served.seen.append((request.url.path, request.url.query, request.headers.get("authorization")))
        return await call_next(request)

    server = ApiServer(app, "127.0.0.1", 0).start()
    served.url = f"http://127.0.0.1:{server.port}"
    try:
        doc["spec"]["model"]["version"] = "1.1.0"
        doc["spec"]["rollout"] = {"steps": [50, 100], "intervalSeconds": 600}
        answer = httpx.post(f"{served.url}/v1/models", content=yaml.safe_dump(doc),
                            headers={"Authorization": f"Bearer {OPERATOR_TOKEN}"}, timeout=30)
        assert answer.status_code == 202, answer.text
        service.rollouts.tick()  # Surging
        service.rollouts.tick()  # Canary(step 1/2, 50%)
        served.seen.clear()
        yield served
    finally:
        server.stop()
