"""Secrets of a secured local cluster (``sie kafka up --secure``): a CA, the broker certificate, SCRAM users.

Everything is made on this machine, nothing downloaded: ``openssl`` (present wherever the JDK is, and
on every Debian/Ubuntu) makes a CA and a broker certificate whose subjectAltName is ``IP:127.0.0.1``,
``DNS:localhost`` and the address of every node that listens elsewhere (``LocalKafka(hosts=...)``: the
one-node Kubernetes cluster's pods reach the broker on the node's address), so clients keep librdkafka's
hostname verification on; a cluster started on other addresses re-issues the broker certificate from the
same CA.  The broker reads PEM directly (``ssl.keystore.type=PEM``: key + certificate in one file, no
keystore password).

Files live in ``<data_dir>/secrets`` (mode 0700; every file 0600 except the CA certificate, which
clients need and is not a secret):

    ca.pem                  the CA certificate clients trust (SIE_SSL_CA_LOCATION)
    ca.key                  the CA's key (only to sign the broker certificate; kept for re-issuing)
    broker.pem              broker key (PKCS#8) + certificate
    broker.san              the subjectAltName broker.pem was issued for (a change re-issues it)
    users/<name>.password   one SCRAM-SHA-512 password per user (SIE_SASL_PASSWORD_FILE)

Users: ``admin`` (the brokers' own inter-broker principal and a super user; created at format time)
and one per SIE role of ``sie.kernel.acls`` (``sie-scorer``, ``sie-agent``, ...; created through the
admin API once the broker runs).  Passwords are 192-bit random url-safe strings (no commas: the
storage tool's ``--add-scram`` syntax forbids them).  No password is ever printed: ``sie kafka up``
prints the paths.
"""

from __future__ import annotations

import ipaddress
import os
import secrets
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from sie.infra.kafka.fetch import require_tool
from sie.kernel.acls import ROLES
from sie.kernel.errors import SieError
from sie.kernel.settings import Settings

ADMIN = "admin"
#: where a secured node's controller listener (PLAINTEXT, ANONYMOUS a super user) listens, whatever its host
LOOPBACK = "127.0.0.1"
MECHANISM = "SCRAM-SHA-512"
SCRAM_ITERATIONS = 8192


def role_user(role: str) -> str:
    """The SCRAM user of an SIE role on the local secured cluster (``sie-scorer``, ...)."""
    return f"sie-{role}"


USERS = (ADMIN, *(role_user(r) for r in ROLES))


def subject_alt_name(hosts: Sequence[str] = ()) -> str:
    """The broker certificate's subjectAltName: loopback, ``localhost`` and each other address a node listens on
    (an address, never a name: the nodes of ``LocalKafka(hosts=...)`` are addresses)."""
    extra = []
    for host in dict.fromkeys(hosts):
        try:
            address = ipaddress.ip_address(host)
        except ValueError:
            raise SieError(f"hosts: an IP address per node (got {host!r})") from None
        if str(address) != "127.0.0.1":
            extra.append(f"IP:{address}")
    return ",".join(["IP:127.0.0.1", "DNS:localhost", *extra])


def _private_dir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(path, 0o700)
    return path


def _write_private(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write(text)


@dataclass(frozen=True)
class SecurityFiles:
    """Where the secured cluster's material lives (paths only; ``ensure`` makes what is missing)."""

    root: Path

    @property
    def ca_cert(self) -> Path:
        return self.root / "ca.pem"

    @property
    def ca_key(self) -> Path:
        return self.root / "ca.key"

    @property
    def broker_pem(self) -> Path:
        return self.root / "broker.pem"

    def password_file(self, user: str) -> Path:
        return self.root / "users" / f"{user}.password"

    def password(self, user: str) -> str:
        return self.password_file(user).read_text(encoding="utf-8").strip()

    @property
    def broker_san(self) -> Path:
        return self.root / "broker.san"

    def ensure(self, hosts: Sequence[str] = ()) -> SecurityFiles:
        """Make the CA, the broker certificate (valid for loopback and ``hosts``) and every user's password,
        where missing (idempotent); a broker certificate issued for other addresses is issued again."""
        _private_dir(self.root)
        _private_dir(self.root / "users")
        san = subject_alt_name(hosts)
        if not (self.ca_cert.is_file() and self.ca_key.is_file()):
            self._make_certificates(san)
        elif not (self.broker_pem.is_file() and self.broker_san.is_file()
                  and self.broker_san.read_text(encoding="utf-8").strip() == san):
            self._make_certificates(san, new_ca=False)
        for user in USERS:
            if not self.password_file(user).is_file():
                _write_private(self.password_file(user), secrets.token_urlsafe(24) + "\n")
        return self

    def add_user(self, user: str) -> Path:
        """A password file for another user (kept if it exists)."""
        if not user or not all(c.isalnum() or c in "._-" for c in user):
            raise SieError(f"user name: letters, digits, '.', '_' and '-' only (got {user!r})")
        _private_dir(self.root / "users")
        if not self.password_file(user).is_file():
            _write_private(self.password_file(user), secrets.token_urlsafe(24) + "\n")
        return self.password_file(user)

    def _make_certificates(self, san: str, new_ca: bool = True) -> None:
        """The CA (``new_ca``) and a broker certificate for ``san`` signed by it."""
        openssl = require_tool("openssl")
        work = self.root

        def run(*args: str) -> None:
            done = subprocess.run([openssl, *args], cwd=work, capture_output=True, text=True, stdin=subprocess.DEVNULL)
            if done.returncode != 0:
                raise SieError(f"openssl {args[0]} failed making the local cluster's TLS material in {work}: "
                               f"{done.stderr.strip()[-500:]}")

        old = os.umask(0o077)  # keys are created 0600
        try:
            if new_ca:
                run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days",
                    "3650", "-subj", "/CN=SIE local Kafka CA", "-addext", "basicConstraints=critical,CA:TRUE",
                    "-addext", "keyUsage=critical,keyCertSign,cRLSign")
            run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "broker.key", "-out", "broker.csr",
                "-subj", "/CN=localhost")
            (work / "broker.ext").write_text(f"subjectAltName={san}\nextendedKeyUsage=serverAuth,clientAuth\n")
            run("x509", "-req", "-in", "broker.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
                "-out", "broker.crt", "-days", "825", "-extfile", "broker.ext")
            key = (work / "broker.key").read_text()
            if "BEGIN PRIVATE KEY" not in key:  # the broker's PEM keystore wants PKCS#8
                run("pkcs8", "-topk8", "-nocrypt", "-in", "broker.key", "-out", "broker.key")
                key = (work / "broker.key").read_text()
            _write_private(self.broker_pem, key + (work / "broker.crt").read_text())
            _write_private(self.broker_san, san + "\n")
        finally:
            os.umask(old)
            for leftover in ("broker.key", "broker.csr", "broker.crt", "broker.ext", "ca.srl"):
                (work / leftover).unlink(missing_ok=True)
        os.chmod(self.ca_cert, 0o644)  # public: what clients trust

    def client_settings(self, settings: Settings, user: str, bootstrap_servers: str) -> Settings:
        """``settings`` for a client of the secured cluster as ``user`` (the password is read from its file)."""
        return settings.model_copy(update={
            "bootstrap_servers": bootstrap_servers, "security_protocol": "SASL_SSL", "sasl_mechanism": MECHANISM,
            "sasl_username": user, "sasl_password": None, "sasl_password_file": self.password_file(user),
            "ssl_ca_location": str(self.ca_cert),
        })

    def client_env(self, user: str) -> dict[str, str]:
        """``SIE_*`` variables of a client as ``user`` (paths only: no secret)."""
        return {"SIE_SECURITY_PROTOCOL": "SASL_SSL", "SIE_SASL_MECHANISM": MECHANISM, "SIE_SASL_USERNAME": user,
                "SIE_SASL_PASSWORD_FILE": str(self.password_file(user)), "SIE_SSL_CA_LOCATION": str(self.ca_cert)}


def secure_server_properties(files: SecurityFiles, broker_port: int, controller_port: int, host: str) -> dict[str, str]:
    """What a secured node adds to (and overrides in) ``ClusterLayout.server_properties``.

    Clients and brokers: SASL_SSL with SCRAM-SHA-512 on the broker port (on ``host``).  The controller
    listener stays PLAINTEXT on loopback whatever ``host`` is (SCRAM on a KRaft controller listener is
    unreliable, KAFKA-15513); its principal ANONYMOUS is a super user so the quorum works, which is why that
    port must never be reachable from another machine, nor from the pods of the one-node Kubernetes cluster,
    which reach the node's address (KIP-919: a controller listener takes CreateTopics, CreateAcls, ...).
    ``StandardAuthorizer`` with ``allow.everyone.if.no.acl.found=false``: a principal without an ACL can do
    nothing.
    """
    admin_password = files.password(ADMIN)
    jaas = (f'org.apache.kafka.common.security.scram.ScramLoginModule required username="{ADMIN}" '
            f'password="{admin_password}";')
    return {
        "listeners": f"SASL_SSL://{host}:{broker_port},CONTROLLER://{LOOPBACK}:{controller_port}",
        "advertised.listeners": f"SASL_SSL://{host}:{broker_port},CONTROLLER://{LOOPBACK}:{controller_port}",
        "inter.broker.listener.name": "SASL_SSL",
        "sasl.enabled.mechanisms": MECHANISM,
        "sasl.mechanism.inter.broker.protocol": MECHANISM,
        "listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config": jaas,
        "ssl.keystore.type": "PEM",
        "ssl.keystore.location": str(files.broker_pem),
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": str(files.ca_cert),
        "ssl.client.auth": "none",
        "ssl.endpoint.identification.algorithm": "https",
        "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "super.users": f"User:{ADMIN};User:ANONYMOUS",
        "allow.everyone.if.no.acl.found": "false",
    }
