"""Hole 2 (high): a spec's ``server_url`` / ``endpoints`` sent every request's prompt to any URL (``file://`` read
through urllib, redirects followed).  Now: only servers the node lists (``SIE_SGLANG_ENDPOINTS``, default none),
http(s) only, no credentials in the URL, redirects never followed (httpx, ``follow_redirects=False``).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest

from sie.kernel.settings import Settings
from sie.schemas.spec import InvalidSpec, load
from sie.schemas.spec_policy import SpecPolicy
from sie.streams.llm.dispatch import Dispatcher
from sie.workers.backends.base import BackendError
from sie.workers.backends.sglang_backend import SGLangClient, SGLangHttpError
from tests.security.http_stub import StubServer
from tests.support.llm_fixtures import llm_spec_doc


def _problems(policy: SpecPolicy, endpoints: list[Any] | None = None, **config: Any) -> list[str]:
    return policy.check(load(llm_spec_doc(endpoints or [], **config)))


@pytest.mark.parametrize(("named", "reason"), [
    ({"endpoints": ["http://10.0.0.9:30000"]}, "endpoints[0]: http://10.0.0.9:30000 is not under this node's LLM "
                                               "endpoints (none); list the server in SIE_SGLANG_ENDPOINTS"),
    ({"server_url": "https://collector.example.com/v1"}, "server_url: https://collector.example.com/v1 is not under"),
    ({"endpoints": [{"url": "http://169.254.169.254/latest", "concurrency": 2}]}, "endpoints[0]: http://169.254.169.254"),
])
def test_a_spec_cannot_send_its_requests_to_a_server_the_node_did_not_list(named: dict[str, Any], reason: str):
    config = {k: v for k, v in named.items() if k != "endpoints"}
    problems = _problems(SpecPolicy(), named.get("endpoints"), **config)
    assert any(reason in p for p in problems), problems
    assert all(p.startswith("spec.backend.config.") for p in problems)


@pytest.mark.parametrize(("named", "reason"), [
    ({"server_url": "file:///etc/passwd"}, "server_url: must be an http(s) URL of a server (got 'file:///etc/passwd')"),
    ({"endpoints": ["gopher://127.0.0.1:70"]}, "endpoints[0]: must be an http(s) URL of a server"),
    ({"endpoints": ["http://127.0.0.1:80011"]}, "endpoints[0]: port out of range 1-65535"),
    ({"endpoints": [{"url": "http://h:0/"}]}, "endpoints[0].url: port out of range 1-65535"),
    ({"server_url": "http://user:pw@:8000"}, "server_url: must name a host"),
])
def test_a_url_that_is_not_a_server_is_a_spec_error_where_parsed(named: dict[str, Any], reason: str):
    """Refused by the parser (``sie validate``), naming the field, never a traceback (issue 41 item 3)."""
    config = {k: v for k, v in named.items() if k != "endpoints"}
    with pytest.raises(InvalidSpec) as err:
        load(llm_spec_doc(named.get("endpoints") or [], **config))
    assert any(p.startswith("spec.backend.config.") and reason in p for p in err.value.problems), err.value.problems
    assert "pw" not in str(err.value)


def test_listed_servers_pass_by_prefix_or_host_and_credentials_never_do():
    policy = SpecPolicy.from_settings(Settings(sglang_endpoints=["http://10.0.0.5:30000/", "gpu-7.internal"]))
    assert _problems(policy, ["http://10.0.0.5:30000", {"url": "http://gpu-7.internal:8000"}]) == []
    assert _problems(policy, ["http://10.0.0.5:30001"]) != []  # another port of a prefix entry
    (secret,) = _problems(policy, ["http://user:pw@gpu-7.internal:8000"])
    assert "carries credentials in the URL" in secret and "pw" not in secret
    with pytest.raises(ValueError, match="SIE_SGLANG_ENDPOINTS"):
        Settings(sglang_endpoints=["https://"])


@pytest.fixture()
def redirect() -> Iterator[tuple[StubServer, StubServer]]:
    target = StubServer(200)
    source = StubServer(302, location=target.url + "/generate")
    yield source, target
    source.close()
    target.close()


def test_the_sglang_client_follows_no_redirect_and_speaks_only_http(redirect: tuple[StubServer, StubServer]):
    source, target = redirect
    client = SGLangClient(source.url)
    with pytest.raises(SGLangHttpError, match="HTTP 302: redirect to .* not followed"):
        client.generate({"text": "a secret prompt"})
    assert source.hits == ["/generate"] and target.hits == []
    with pytest.raises(BackendError, match="only http"):
        SGLangClient("file:///etc/passwd")


def test_the_llm_window_client_follows_no_redirect():
    dispatcher = Dispatcher.__new__(Dispatcher)
    Dispatcher.__init__(dispatcher, pool=None, protocol=None, concurrency=1, stop=threading.Event(),  # type: ignore[arg-type]
                        on_done=lambda _j: None, is_current=lambda _j: True)
    assert dispatcher._client.follow_redirects is False
    dispatcher._client.close()
