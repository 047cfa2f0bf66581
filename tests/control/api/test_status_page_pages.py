"""The status page reads models, nodes and replicas a page at a time (``?limit=&after=``), in headless Chromium
against a served control API (tests/support/status_page_fixtures.py, its statuses set as in test_read_answers):
the first page, the next and the previous one, and the model and state filter, each against the statuses."""

from __future__ import annotations

from pathlib import Path

import pytest
from playwright.sync_api import sync_playwright

from sie.control.reconcile.status import ModelStatus, ReplicaView
from sie.schemas.replica_state import ReplicaState
from tests.support.helpers import VIEWER_TOKEN
from tests.support.status_page_fixtures import CHROMIUM, CHROMIUM_ARGS, served_control

pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed (Debian: apt-get install chromium)")

#: 3 models x 5 replicas; every third replica STARTING
STATUSES = {f"m{m}": ModelStatus(
    f"m{m}", "1.0.0", "P1", "scoring", "Progressing", None, 5, 3,
    tuple(ReplicaView(f"m{m}-{k}", f"m{m}", "1.0.0", "node-a", (), 0,
                      ReplicaState.STARTING if (m * 5 + k) % 3 == 0 else ReplicaState.READY) for k in range(5)))
    for m in range(3)}
EVERY = sorted(r.replica_id for s in STATUSES.values() for r in s.replicas)


def _shown(page) -> list[str]:  # noqa: ANN001 - a Playwright Page
    return page.eval_on_selector_all("#replicas tbody tr", "rows => rows.map(r => r.dataset.replica)")


def _count(page) -> str:  # noqa: ANN001
    return page.text_content(".pager[data-for=replicas] .count") or ""


def test_the_replicas_come_a_page_at_a_time_and_filter(tmp_path: Path) -> None:
    with served_control(tmp_path) as served, sync_playwright() as pw:
        served.service.controller.statuses = STATUSES
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            # bypass_csp: the test's probes are evaluated as strings (test_observability_e2e says why)
            page = browser.new_page(viewport={"width": 1500, "height": 900}, bypass_csp=True)
            page.goto(f"{served.url}/status?refresh_ms=250&page=10")
            page.fill("#token", VIEWER_TOKEN)
            page.click("#login-form button[type=submit]")
            page.wait_for_function("document.querySelectorAll('#replicas tbody tr').length === 10", timeout=15_000)
            assert _shown(page) == EVERY[:10] and _count(page) == "replicas 1\u201310 of 15"
            assert page.is_hidden(".pager[data-for=replicas] .prev")
            assert any(q.startswith("limit=10") for p, q, _a in served.seen if p == "/v1/replicas")

            page.click(".pager[data-for=replicas] .next")
            page.wait_for_function("document.querySelectorAll('#replicas tbody tr').length === 5", timeout=15_000)
            assert _shown(page) == EVERY[10:] and _count(page) == "replicas 11\u201315 of 15"
            assert page.is_hidden(".pager[data-for=replicas] .next")
            page.click(".pager[data-for=replicas] .prev")
            page.wait_for_function("document.querySelectorAll('#replicas tbody tr').length === 10", timeout=15_000)
            assert _shown(page) == EVERY[:10]

            page.fill("#filter-model", "m1")
            page.select_option("#filter-state", "STARTING")
            page.click("#filter-form button[type=submit]")
            starting = [r.replica_id for r in STATUSES["m1"].replicas if r.state is ReplicaState.STARTING]
            page.wait_for_function(f"document.querySelectorAll('#replicas tbody tr').length === {len(starting)}",
                                   timeout=15_000)
            assert _shown(page) == starting and _count(page) == f"replicas 1\u2013{len(starting)} of {len(starting)}"
            assert page.eval_on_selector_all("#models tbody tr", "rows => rows.map(r => r.dataset.model)") == ["m1"]
            # a filter the API refuses: its reason on the page, not a blank table
            page.fill("#filter-model", "M1")
            page.click("#filter-form button[type=submit]")
            page.wait_for_function("document.getElementById('error').textContent.includes('lowercase')",
                                   timeout=15_000)
        finally:
            browser.close()
