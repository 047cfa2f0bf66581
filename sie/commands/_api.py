"""The CLI's client of a control plane's HTTP API (``--control-url`` / ``SIE_CONTROL_URL``).

Sends the bearer token (``SIE_API_TOKEN``, else the local operator token file that ``sie control``
wrote on this machine) and verifies HTTPS against ``SIE_API_CA`` when set.  A token goes only to a loopback URL or
over https (``SIE_API_TOKEN_OVER_HTTP`` opts into plain http), and the local token file only to this machine
(``sie.control.api.auth.token_for_url``); redirects are never followed (httpx's default).  Every failure becomes a
``SieError`` naming the URL and the fix; the token never appears in a message.
"""

from __future__ import annotations

from typing import Any

from sie.kernel.errors import SieError
from sie.kernel.settings import Settings


def _json(content: bytes) -> Any:
    """An answer's JSON; orjson: a list of 30,000 replicas (8 MB) parses in a third of the time ``json`` takes."""
    import orjson

    return orjson.loads(content)


class ApiRefused(SieError):
    """The control plane answered with an error status; ``status`` and ``body`` say which."""

    def __init__(self, message: str, status: int, body: Any) -> None:
        super().__init__(message)
        self.status, self.body = status, body


class ControlApi:
    """A few calls to one control plane."""

    def __init__(self, settings: Settings, url: str, timeout: float = 20.0) -> None:
        from sie.control.api.auth import token_for_url

        self.url = url.rstrip("/")
        self._settings = settings
        self._token = token_for_url(settings, self.url)  # SieError before anything is sent where it must not go
        self._timeout = timeout

    def _headers(self, content_type: str | None = None) -> dict[str, str]:
        headers = {"Accept": "application/json"}
        if self._token:
            headers["Authorization"] = f"Bearer {self._token}"
        if content_type:
            headers["Content-Type"] = content_type
        return headers

    def client_options(self) -> tuple[Any, dict[str, Any]]:
        """``verify`` for an ``httpx.Client`` and the ``extensions`` of each request: the CA (SIE_API_CA) and the
        name the certificate is checked against when the URL names another address (SIE_API_TLS_SERVER_NAME)."""
        import ssl

        if not self.url.startswith("https://"):
            # plain http: no certificate to verify (redirects are never followed), and httpx's default verification
            # loads the CA bundle, ~0.1 s of each command's start
            return False, {}
        verify: Any = ssl.create_default_context(cafile=str(self._settings.api_ca)) if self._settings.api_ca else True
        name = self._settings.api_tls_server_name
        return verify, ({"sni_hostname": name} if name and self.url.startswith("https://") else {})

    def request(self, method: str, path: str, body: str | None = None) -> Any:
        """The JSON answer of a 2xx; ``ApiRefused`` for an error status, ``SieError`` when nobody answers."""
        import httpx

        verify, extensions = self.client_options()
        try:
            with httpx.Client(verify=verify, timeout=self._timeout, follow_redirects=False) as client:
                response = client.request(method, self.url + path, content=body, extensions=extensions,
                                          headers=self._headers("application/yaml" if body is not None else None))
        except httpx.HTTPError as exc:
            raise SieError(f"control plane {self.url} did not answer {method} {path} ({type(exc).__name__}: {exc}); "
                           "check --control-url / SIE_CONTROL_URL (and SIE_API_CA for https)") from None
        try:
            payload = _json(response.content)
        except ValueError:
            payload = {"error": response.text[:200]}
        if response.status_code < 400:
            return payload
        reason = payload.get("error") if isinstance(payload, dict) else str(payload)
        if response.status_code == 401:
            hint = ("no token was sent: set SIE_API_TOKEN" if not self._token
                    else "the token was not accepted: check SIE_API_TOKEN")
            raise ApiRefused(f"control plane {self.url} refused {method} {path} (401): {hint} "
                             f"(or run where {self._settings.api_token_file} is readable)", 401, payload)
        if response.status_code == 403:
            raise ApiRefused(f"control plane {self.url}: {reason} (403); ask an operator for an operator token", 403, payload)
        raise ApiRefused(f"control plane {self.url}: {method} {path} -> {response.status_code}: {reason}",
                         response.status_code, payload)

    def get(self, path: str) -> Any:
        return self.request("GET", path)

    def find(self, path: str) -> Any | None:
        """The JSON answer of a GET, or None for a 404."""
        try:
            return self.request("GET", path)
        except ApiRefused as exc:
            if exc.status == 404:
                return None
            raise

    def upload(self, path: str, data: Any, params: dict[str, str] | None = None, timeout: float = 600.0) -> Any:
        """PUT raw bytes (``bytes`` or an iterator of them, streamed); the JSON answer of a 2xx."""
        import httpx

        verify, extensions = self.client_options()
        try:
            with httpx.Client(verify=verify, timeout=httpx.Timeout(timeout, connect=self._timeout),
                              follow_redirects=False) as client:
                response = client.put(self.url + path, content=data, params=params, extensions=extensions,
                                      headers=self._headers("application/octet-stream"))
        except httpx.HTTPError as exc:
            raise SieError(f"control plane {self.url} did not take the upload PUT {path} ({type(exc).__name__}: "
                           f"{exc}); check --control-url / SIE_CONTROL_URL") from None
        try:
            payload = response.json()
        except ValueError:
            payload = {"error": response.text[:200]}
        if response.status_code < 400:
            return payload
        reason = payload.get("error") if isinstance(payload, dict) else str(payload)
        raise ApiRefused(f"control plane {self.url}: PUT {path} -> {response.status_code}: {reason}",
                         response.status_code, payload)
