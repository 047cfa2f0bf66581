"""`sie rollout status`: the timeline at readable times (issue 28.4: it printed `1796153631750 Pending -> Surging`)."""

from __future__ import annotations

from sie.commands.rollout import status_lines, utc_iso

STARTED = 1796153631750  # 2026-12-01T19:33:51.750Z


def _doc() -> dict:
    return {"model": "churn", "stable_version": "1.0.0", "canary_version": "1.1.0", "label": "Canary(step 1/3, 10%)",
            "weight_percent": 10.0, "epoch": 3, "started_ms": STARTED, "events": [
                {"at_ms": STARTED, "from": "Pending", "to": "Surging", "step": 0, "weight_bp": 0, "reason": "v1.1.0"},
                {"at_ms": STARTED + 12_345, "from": "Surging", "to": "Canary", "step": 1, "weight_bp": 1000,
                 "reason": "surge ready; canary 10%"}]}


def test_utc_iso_is_to_the_millisecond_and_says_utc():
    assert utc_iso(STARTED) == "2026-12-01T19:33:51.750Z"
    assert utc_iso(0) == "1970-01-01T00:00:00.000Z"


def test_the_timeline_shows_utc_times_and_seconds_after_the_start():
    lines = status_lines(_doc(), now=STARTED / 1000 + 95)
    assert lines[0] == "churn: 1.0.0 -> 1.1.0  Canary(step 1/3, 10%)  canary 10%  epoch 3"
    assert lines[1] == "  started 2026-12-01T19:33:51.750Z (95s ago)"
    assert lines[2].startswith("  2026-12-01T19:33:51.750Z     +0.0s      Pending -> Surging")
    assert lines[3].startswith("  2026-12-01T19:34:04.095Z    +12.3s      Surging -> Canary")
    assert lines[3].endswith("10%  surge ready; canary 10%")
    assert not any(str(STARTED) in line for line in lines)
