"""The status page shows rollouts (issue 22, operator surface): versions, phase, step, stable/new weights,
epoch and the last transition at a readable time, in headless Chromium against a served control API
(tests/support/status_page_fixtures.py: ``churn`` at ``Canary(step 1/2, 50%)``)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from playwright.sync_api import sync_playwright

from tests.support.helpers import OPERATOR_TOKEN, VIEWER_TOKEN
from tests.support.status_page_fixtures import CHROMIUM, CHROMIUM_ARGS, served_control

pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed (Debian: apt-get install chromium)")


def _rollout_rows(page) -> dict[str, list[str]]:  # noqa: ANN001 - a Playwright Page
    return page.eval_on_selector_all(
        "#rollouts tbody tr",
        "rows => Object.fromEntries(rows.map(r => [r.dataset.model, Array.from(r.cells).map(td => td.textContent)]))")


def test_a_rollout_in_progress_is_on_the_status_page_and_follows_an_abort(tmp_path: Path) -> None:
    import httpx

    with served_control(tmp_path) as served, sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1500, "height": 900})
            page.goto(f"{served.url}/status?refresh_ms=250")
            page.fill("#token", VIEWER_TOKEN)
            page.click("#login-form button[type=submit]")
            page.wait_for_selector("#rollouts tbody tr[data-model=churn]", timeout=15_000)
            assert page.is_hidden("#rollouts-none")
            cells = _rollout_rows(page)["churn"]
            assert cells[:6] == ["churn", "1.0.0 \u2192 1.1.0", "Canary(step 1/2, 50%)", "1 / 2", "50% / 50%", "1"], cells
            assert re.match(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z \(\d+ s ago\): Surging \u2192 Canary: ", cells[6]), cells
            assert page.get_attribute("#rollouts tr[data-model=churn] .state", "class") == "state warn"

            answer = httpx.post(f"{served.url}/v1/rollouts/churn/abort",
                                headers={"Authorization": f"Bearer {OPERATOR_TOKEN}"}, timeout=30)
            assert answer.status_code == 200, answer.text
            page.wait_for_selector("#rollouts tr[data-model=churn][data-phase=RollingBack]", timeout=15_000)
            cells = _rollout_rows(page)["churn"]
            assert cells[2] == "RollingBack" and cells[4] == "100% / 0%" and "\u2192 RollingBack" in cells[6], cells
            assert page.get_attribute("#rollouts tr[data-model=churn] .state", "class") == "state bad"
        finally:
            browser.close()
