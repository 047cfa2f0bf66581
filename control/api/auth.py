"""Who may call the control API: bearer tokens, hashed at rest, each with a role.

Roles (Kubernetes' read vs write split): ``viewer`` may GET every route; ``operator`` may also apply
and delete models.  A token is 256 random bits (``sie_`` + 43 url-safe characters); the server keeps
only its SHA-256 (a slow password hash buys nothing for random tokens and would cost every
request), in the tokens file (``SIE_API_TOKENS_FILE``, JSON, mode 0600) and/or ``SIE_API_TOKENS``.

First start: when no token is configured at all, the control plane creates one operator token,
stores its hash in the tokens file, and writes the token itself to ``SIE_API_TOKEN_FILE`` (mode
0600, ``<cache_dir>/control/operator.token``): a local ``sie`` CLI (or the demo, or a test harness)
reads it from there; anyone else needs a token an operator gives them (``sie token create``).
Several instances starting at once on one machine agree on one token (the file is created with
``O_EXCL``).  The tokens file is re-read when it changes, so ``sie token create`` needs no restart.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import secrets
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sie.kernel.errors import ConfigError
from sie.kernel.settings import API_ROLES, ApiTokenEntry, Settings

log = logging.getLogger(__name__)

TOKEN_PREFIX = "sie_"
#: what each role may do; a route asks for one of these
ROLE_RANK = {role: rank for rank, role in enumerate(API_ROLES)}


@dataclass(frozen=True)
class Principal:
    """An authenticated caller: the token's name and role (what audit events say)."""

    name: str
    role: str

    def may(self, role: str) -> bool:
        return ROLE_RANK[self.role] >= ROLE_RANK[role]


def new_token() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def _write_private(path: Path, text: str, exclusive: bool = False) -> None:
    """Write ``text`` to a file only its owner can read (0600 from creation: never briefly world-readable)."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    if exclusive:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    else:
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write(text)
    if not exclusive:
        os.replace(tmp, path)


def read_token_entries(path: Path) -> list[ApiTokenEntry]:
    """The entries of a tokens file (none if it does not exist); a malformed file is a ConfigError naming it."""
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return []
    except (OSError, ValueError) as exc:
        raise ConfigError(f"SIE_API_TOKENS_FILE {path}: not readable JSON ({exc}); fix or remove it") from None
    items = raw.get("tokens") if isinstance(raw, dict) else None
    if not isinstance(items, list):
        raise ConfigError(f"SIE_API_TOKENS_FILE {path}: expected {{\"tokens\": [...]}}")
    try:
        return [ApiTokenEntry.model_validate(item) for item in items]
    except ValueError as exc:
        raise ConfigError(f"SIE_API_TOKENS_FILE {path}: {str(exc).splitlines()[0]}") from None


def add_token(path: Path, name: str, role: str, clock: Any = time.time) -> str:
    """Create a token, append its hash to the tokens file, return the token (shown once, never stored)."""
    if role not in ROLE_RANK:
        raise ConfigError(f"role: must be one of {', '.join(API_ROLES)} (got {role!r})")
    entries = read_token_entries(path)
    if any(e.name == name for e in entries):
        raise ConfigError(f"a token named {name!r} already exists in {path}; pick another name or revoke it first")
    token = new_token()
    entries.append(ApiTokenEntry(name=name, role=role, sha256=hash_token(token), created_ms=int(clock() * 1000)))
    _write_private(path, json.dumps({"tokens": [e.model_dump() for e in entries]}, indent=1) + "\n")
    return token


def revoke_token(path: Path, name: str) -> bool:
    entries = read_token_entries(path)
    kept = [e for e in entries if e.name != name]
    if len(kept) == len(entries):
        return False
    _write_private(path, json.dumps({"tokens": [e.model_dump() for e in kept]}, indent=1) + "\n")
    return True


def ensure_initial_token(settings: Settings) -> Path | None:
    """If no token is configured anywhere, create the first operator token; return the file holding it.

    Returns None when tokens are already configured (nothing created). Race-free between instances
    started together: the operator token file is created exclusively; the loser reads the winner's.
    """
    if settings.api_tokens or read_token_entries(settings.api_tokens_file):
        return None
    token_file = settings.api_token_file
    try:
        token = new_token()
        _write_private(token_file, token + "\n", exclusive=True)
    except FileExistsError:
        token = token_file.read_text(encoding="utf-8").strip()
    entry = ApiTokenEntry(name="operator", role="operator", sha256=hash_token(token), created_ms=int(time.time() * 1000))
    if not read_token_entries(settings.api_tokens_file):
        _write_private(settings.api_tokens_file, json.dumps({"tokens": [entry.model_dump()]}, indent=1) + "\n")
    return token_file


class TokenStore:
    """The tokens the API accepts: ``SIE_API_TOKENS`` plus the tokens file, re-read when the file changes."""

    def __init__(self, settings: Settings, recheck_s: float = 1.0) -> None:
        self._fixed = list(settings.api_tokens)
        self._path = settings.api_tokens_file
        self._recheck_s = recheck_s
        self._lock = threading.Lock()
        self._stamp: tuple[int, int] | None = None
        self._checked_at = 0.0
        self._entries: list[ApiTokenEntry] = self._fixed + read_token_entries(self._path)  # a bad file fails start
        self._stamp = self._file_stamp()

    def _file_stamp(self) -> tuple[int, int] | None:
        try:
            st = self._path.stat()
        except FileNotFoundError:
            return None
        return (st.st_mtime_ns, st.st_size)

    def _reload(self) -> None:
        stamp = self._file_stamp()
        if stamp != self._stamp:
            try:
                self._entries = self._fixed + read_token_entries(self._path)
                self._stamp = stamp
            except ConfigError as exc:  # keep the tokens we had: a half-edited file must not lock everyone out
                log.error("%s; keeping the %d token(s) loaded before", exc, len(self._entries))
        self._checked_at = time.monotonic()

    def __len__(self) -> int:
        return len(self._entries)

    def authenticate(self, token: str | None) -> Principal | None:
        """The principal of ``token``, or None. Compares every stored hash in constant time."""
        if not token:
            return None
        with self._lock:
            if time.monotonic() - self._checked_at >= self._recheck_s:
                self._reload()
            entries = list(self._entries)
        digest = hash_token(token)
        found: ApiTokenEntry | None = None
        for entry in entries:
            if hmac.compare_digest(entry.sha256, digest):
                found = entry
        return Principal(found.name, found.role) if found is not None else None


def is_loopback_url(url: str) -> bool:
    """Whether ``url`` names this machine (``localhost``, 127.0.0.0/8, ``::1``)."""
    import ipaddress
    from urllib.parse import urlsplit

    host = (urlsplit(url).hostname or "").lower()
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def token_for_url(settings: Settings, url: str) -> str | None:
    """The token the CLI may send to ``url``, or None when it has none; ``SieError`` when it would go where it must
    not: ``SIE_API_TOKEN`` only to a loopback URL or over https (plain http to another host only with
    ``SIE_API_TOKEN_OVER_HTTP=true``), the local operator token file only to a control plane on this machine."""
    from urllib.parse import urlsplit

    from sie.kernel.errors import SieError

    token = client_token(settings)
    if token is None or is_loopback_url(url):
        return token
    shown = f"{urlsplit(url).scheme}://{urlsplit(url).netloc.rpartition('@')[2]}"
    if settings.api_token is None:
        raise SieError(f"not sending the local operator token ({settings.api_token_file}) to {shown}: it belongs to "
                       "the control plane on this machine; set SIE_API_TOKEN to a token of that control plane")
    if urlsplit(url).scheme != "https" and not settings.api_token_over_http:
        raise SieError(f"not sending SIE_API_TOKEN to {shown} over plain http (anyone on the path could read it): "
                       "use https:// (SIE_API_TLS_CERT on the control plane, SIE_API_CA here), or set "
                       "SIE_API_TOKEN_OVER_HTTP=true if the network is yours")
    return token


def client_token(settings: Settings) -> str | None:
    """The token a CLI sends: ``SIE_API_TOKEN``, else the local operator token file if this user can read it."""
    if settings.api_token is not None:
        return settings.api_token.get_secret_value()
    try:
        return settings.api_token_file.read_text(encoding="utf-8").strip() or None
    except OSError:
        return None
