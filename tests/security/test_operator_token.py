"""The operator sends its token only where the CLI would (issue 37, item 2): ``ControlClient`` sent the operator
token over plain http to any host.  Now the same rule as the CLI (``token_for_url``): a loopback URL or https
(plain http elsewhere only with ``SIE_API_TOKEN_OVER_HTTP=true``), refused before any byte is sent, and no
redirect is followed (it would carry the token to the redirect's host)."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from sie.cli import cli
from sie.k8s.operator import ControlClient
from sie.kernel.errors import SieError
from sie.kernel.settings import Settings
from tests.security.http_stub import StubServer


@pytest.fixture()
def operator_settings(tmp_path: Path) -> Settings:
    return Settings(cache_dir=tmp_path, api_token="sie_operator-secret")


def test_the_operator_refuses_plain_http_to_another_host_before_sending(operator_settings: Settings):
    with pytest.raises(SieError, match="over plain http") as refused:
        ControlClient(operator_settings, "http://sie-control.sie.svc:8470")
    assert "sie_operator-secret" not in str(refused.value)


@pytest.mark.parametrize("url", ["https://sie-control.sie.svc:8470", "http://127.0.0.1:8470", "http://localhost:1"])
def test_https_or_loopback_gets_the_token(operator_settings: Settings, url: str):
    assert ControlClient(operator_settings, url)._token == "sie_operator-secret"


def test_plain_http_elsewhere_only_with_the_opt_in(tmp_path: Path):
    opted = Settings(cache_dir=tmp_path, api_token="sie_operator-secret", api_token_over_http=True)
    assert ControlClient(opted, "http://sie-control.sie.svc:8470")._token == "sie_operator-secret"


def test_sie_operator_run_stops_naming_the_rule(tmp_path: Path):
    result = CliRunner().invoke(cli, ["operator", "run", "--control-url", "http://10.0.0.7:8470", "--health-port", "0",
                                      "--namespace", "sie", "--kubeconfig", str(tmp_path / "none")],
                                env={"SIE_CACHE_DIR": str(tmp_path), "SIE_API_TOKEN": "sie_operator-secret"})
    assert result.exit_code != 0
    assert "over plain http" in str(result.exception) + result.output, (result.exception, result.output)


def test_a_redirect_is_not_followed(operator_settings: Settings):
    target = StubServer(200)
    redirect = StubServer(307, location=target.url + "/v1/models/m")
    try:
        ControlClient(operator_settings, redirect.url).model("m")
        assert redirect.hits == ["/v1/models/m"] and target.hits == []
    finally:
        target.close()
        redirect.close()
