"""`sie status --screenshot FILE` (issue 28.9): the status page captured by headless Chromium with the CLI's
token, which never enters a URL or the page (it is put on the wire by the browser driver), against a served
control API (no Kafka: tests/support/status_page_fixtures.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sie.cli import main
from tests.support.helpers import OPERATOR_TOKEN, VIEWER_TOKEN
from tests.support.status_page_fixtures import CHROMIUM, served_control

pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed (Debian: apt-get install chromium)")


@pytest.fixture()
def control(tmp_path: Path):
    with served_control(tmp_path) as served:
        yield served.url, served.seen


def _png(path: Path) -> bytes:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return data


def test_a_screenshot_is_taken_signed_in_with_the_token_on_the_wire_only(control, tmp_path, monkeypatch, capsys):
    url, seen = control
    monkeypatch.setenv("SIE_API_TOKEN", VIEWER_TOKEN)
    shot = tmp_path / "shots" / "status.png"
    assert main(["status", "--control-url", url, "--screenshot", str(shot)]) == 0, capsys.readouterr().err
    assert f"wrote {shot}" in capsys.readouterr().out
    assert len(_png(shot)) > 10_000
    api_calls = [(p, q, a) for p, q, a in seen if not p.startswith("/status")]
    assert {p for p, _q, _a in api_calls} >= {"/v1/models", "/v1/nodes", "/v1/replicas", "/v1/events", "/healthz"}
    assert all(a == f"Bearer {VIEWER_TOKEN}" for _p, _q, a in api_calls), api_calls  # the real token, on the wire
    assert not any(VIEWER_TOKEN in q for _p, q, _a in seen)  # never in a URL
    assert all(a is None for p, _q, a in seen if p.startswith("/status"))  # the page's files need none


def test_the_operator_token_file_is_used_when_no_token_is_set(control, tmp_path, monkeypatch, capsys):
    url, seen = control
    token_file = tmp_path / "operator.token"
    token_file.write_text(OPERATOR_TOKEN + "\n")
    token_file.chmod(0o600)
    monkeypatch.delenv("SIE_API_TOKEN", raising=False)
    monkeypatch.setenv("SIE_API_TOKEN_FILE", str(token_file))
    shot = tmp_path / "status.png"
    assert main(["status", "--control-url", url, "--screenshot", str(shot)]) == 0, capsys.readouterr().err
    _png(shot)
    assert any(a == f"Bearer {OPERATOR_TOKEN}" for p, _q, a in seen if p == "/v1/models")


def test_a_refused_token_is_an_error_naming_the_fix_not_a_picture_of_the_sign_in_form(control, tmp_path,
                                                                                     monkeypatch, capsys):
    url, _seen = control
    monkeypatch.setenv("SIE_API_TOKEN", "sie_not-a-token-of-this-cluster")
    shot = tmp_path / "status.png"
    assert main(["status", "--control-url", url, "--screenshot", str(shot)]) == 1
    err = capsys.readouterr().err
    assert "refused the token" in err and "SIE_API_TOKEN" in err and "sie_not-a-token" not in err
    assert not shot.exists()


def test_without_screenshot_it_names_the_page_and_how_to_sign_in(capsys):
    assert main(["status", "--control-url", "http://127.0.0.1:8470/"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("http://127.0.0.1:8470/status ") and "--role viewer" in out


def test_a_browser_that_is_not_there_is_named(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SIE_API_TOKEN", VIEWER_TOKEN)
    assert main(["status", "--screenshot", str(tmp_path / "x.png"), "--browser", str(tmp_path / "nochrome")]) == 1
    assert "nochrome: no such file; pass --browser PATH" in capsys.readouterr().err
    assert os.listdir(tmp_path) == []
