"""Hole 10: the CLI sent the local operator token to any ``--control-url``, over plain http too.  Now a token goes
only to a loopback URL or over https (``SIE_API_TOKEN_OVER_HTTP=true`` opts into plain http), and the local
operator token file only to a control plane on this machine; the refusal comes before any byte is sent.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from sie.cli import cli
from sie.commands._api import ControlApi
from sie.kernel.errors import SieError
from sie.kernel.settings import Settings
from tests.security.http_stub import StubServer


@pytest.fixture()
def local_token(tmp_path: Path) -> Settings:
    settings = Settings(cache_dir=tmp_path)
    settings.api_token_file.parent.mkdir(parents=True)
    settings.api_token_file.write_text("sie_local-operator-token\n")
    return settings


@pytest.mark.parametrize("url", ["http://127.0.0.1:9", "http://localhost:8080/", "http://[::1]:80", "http://127.9.9.9"])
def test_loopback_urls_get_the_local_token(local_token: Settings, url: str):
    assert ControlApi(local_token, url)._headers()["Authorization"] == "Bearer sie_local-operator-token"


@pytest.mark.parametrize("url", ["http://10.0.0.7:8080", "https://control.example.com", "http://127.0.0.1.evil.com"])
def test_the_local_operator_token_never_leaves_this_machine(local_token: Settings, url: str):
    with pytest.raises(SieError, match="not sending the local operator token .* set SIE_API_TOKEN") as refused:
        ControlApi(local_token, url)
    assert "sie_local-operator-token" not in str(refused.value)


def test_an_explicit_token_goes_over_https_or_with_the_opt_in_only(tmp_path: Path):
    explicit = Settings(cache_dir=tmp_path, api_token="sie_explicit")
    assert ControlApi(explicit, "https://control.example.com")._headers()["Authorization"] == "Bearer sie_explicit"
    with pytest.raises(SieError, match="not sending SIE_API_TOKEN to http://10.0.0.7:8080 over plain http") as refused:
        ControlApi(explicit, "http://user:pw@10.0.0.7:8080")
    assert "pw" not in str(refused.value) and "sie_explicit" not in str(refused.value)
    opted = Settings(cache_dir=tmp_path, api_token="sie_explicit", api_token_over_http=True)
    assert ControlApi(opted, "http://10.0.0.7:8080")._headers()["Authorization"] == "Bearer sie_explicit"


def test_the_cli_refuses_before_sending_anything(local_token: Settings):
    server = StubServer(200)  # on loopback, but reached through a name that is not: stands for a remote host
    try:
        url = server.url.replace("127.0.0.1", "127.0.0.1.nip.io")
        result = CliRunner().invoke(cli, ["get", "models", "--control-url", url],
                                    env={"SIE_CACHE_DIR": str(local_token.cache_dir)})
        assert result.exit_code != 0 and "not sending the local operator token" in str(result.exception)
        assert server.hits == []
    finally:
        server.close()
