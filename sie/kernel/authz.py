"""Kafka authorization failures as one clear, final error: who may not do what on which resource, and the fix.

A missing ACL is not an outage: retrying never helps (until someone adds the ACL), so a stage that
meets one stops with ``NotAuthorized`` instead of aborting and re-reading its batch forever.  The
message names the principal, the operation, the resource and the fix (``sie acls plan``), never a
secret.  ``from_kafka_error`` recognises librdkafka's authorization error codes, and the text of an
abortable transaction error that carries one (a record refused by the broker makes
``commit_transaction`` fail with its reason).
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import Any

from sie.kernel.errors import SieError

#: (command, role, scope flags) of the CLI command running now (``needs_role``): a refusal names that role's grant
_COMMAND: ContextVar[tuple[str, str, str] | None] = ContextVar("sie_command_role", default=None)


def needs_role(command: str, role: str, scope: str = "") -> None:
    """Say which role's ACLs the running CLI command needs (``sie.kernel.acls.COMMAND_ROLES``): a
    ``NotAuthorized`` raised while it runs names ``sie acls apply --role ROLE ... SCOPE`` instead of a generic
    pointer.  ``scope``: the flags that narrow the plan (``--model churn``)."""
    _COMMAND.set((command, role, scope))


def _fix(principal: str | None) -> str:
    who = principal or "NAME"
    running = _COMMAND.get()
    if running is not None:
        command, role, scope = running
        return (f"`{command}` runs as role {role}: an administrator grants it with `sie acls apply --role {role} "
                f"--principal {who}{' ' + scope if scope else ''}` (see it first with `sie acls plan`; "
                "docs/security.md, \"The roles and their ACLs\")")
    return (f"grant the ACL of the component's role (`sie acls plan --role ROLE --principal {who}` shows what each "
            "SIE role needs: scorer, agent, control, cdc, backfill, producer, consumer; docs/security.md)")

#: librdkafka error name -> (resource, the operation SIE's roles need on it)
_CODES = {
    "TOPIC_AUTHORIZATION_FAILED": "topic",
    "GROUP_AUTHORIZATION_FAILED": "group",
    "TRANSACTIONAL_ID_AUTHORIZATION_FAILED": "transactional id",
    "CLUSTER_AUTHORIZATION_FAILED": "cluster",
}
_TEXTS = {
    "topic authorization failed": "topic",
    "group authorization failed": "group",
    "transactional id authorization failed": "transactional id",
    "cluster authorization failed": "cluster",
}


class NotAuthorized(SieError):
    """Kafka refused an operation to this principal (a missing ACL); not retried."""

    def __init__(self, principal: str | None, operation: str, resource: str, name: str | None, detail: str,
                 candidates: tuple[str, ...] = ()) -> None:
        self.principal, self.operation, self.resource, self.name = principal, operation, resource, name
        who = f"User:{principal}" if principal else "this client's principal"
        if name:
            what = f"{resource} {name!r}"
        elif candidates:  # e.g. the topics a refused transaction wrote to: the broker does not say which
            what = f"{resource} " + " or ".join(repr(c) for c in candidates)
        else:
            what = resource
        super().__init__(f"not authorized: {who} may not {operation} {what} ({detail}); {_fix(principal)}")


class NotAuthenticated(SieError):
    """The cluster refused this client's credentials (SASL or TLS): a configuration error, not an outage."""

    def __init__(self, bootstrap: str, principal: str | None, detail: str) -> None:
        who = f"user {principal!r}" if principal else "this client"
        super().__init__(
            f"Kafka at {bootstrap} refused the credentials of {who} ({detail}); check SIE_SASL_USERNAME and "
            "SIE_SASL_PASSWORD_FILE / SIE_SASL_PASSWORD (or the mTLS certificate, SIE_SSL_CA_LOCATION)")


#: librdkafka error names meaning "authentication failed" (error_cb), not "broker down"
AUTHENTICATION_ERRORS = frozenset({"_AUTHENTICATION", "SASL_AUTHENTICATION_FAILED", "_SSL"})


def topic_partitions(client: Any, topic: str, config: dict[str, Any], operation: str,
                     timeout: float = 10.0) -> tuple[int, ...] | None:
    """The partition ids of ``topic``; None if it does not exist; ``NotAuthorized`` if this principal may not
    Describe it, naming the principal, ``operation`` and the topic (the ACL to grant).

    The one look-up for everything that reads a topic by name (``sie tail``, ``sie describe model``, ``sie dlq
    redrive``, ``sie backfill``): on a cluster with ACLs a topic the principal may not Describe is absent from
    a cluster-wide listing, exactly like a missing one, so "does not exist" would send the user after the
    wrong fix.  Asked for by name, Kafka says which (``TOPIC_AUTHORIZATION_FAILED``).  ``client``: an
    AdminClient is asked with ``describe_topics``, which (unlike its metadata request naming the topic) never
    auto-creates it; a consumer with a metadata request naming the topic (consumers never auto-create:
    ``allow.auto.create.topics`` is off).  ``config``: the client's librdkafka config (its ``sasl.username``
    is the principal named).  ``operation``: what the caller needs (READ and WRITE imply Describe), i.e. the
    ACL ``sie acls plan`` grants.  Other Kafka errors propagate.
    """
    from confluent_kafka import KafkaError, KafkaException, TopicCollection

    if hasattr(client, "describe_topics"):
        try:
            described = client.describe_topics(TopicCollection([topic]), request_timeout=timeout)[topic].result(
                timeout=timeout)
        except KafkaException as exc:
            err = exc.args[0] if exc.args else None
            denied = from_kafka_error(err, config, operation, topic)
            if denied is not None:
                raise denied from None
            if err is not None and err.code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
                return None
            raise
        return tuple(sorted(p.id for p in described.partitions)) or None
    meta = client.list_topics(topic, timeout=timeout).topics.get(topic)
    if meta is None:
        return None
    if meta.error is not None:
        denied = from_kafka_error(meta.error, config, operation, topic)
        if denied is not None:
            raise denied
        if meta.error.code() in (KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC):
            return None
        raise KafkaException(meta.error)
    return tuple(sorted(meta.partitions)) or None


def topic_denied(admin: Any, topic: str, config: dict[str, Any], operation: str,
                 timeout: float = 10.0) -> NotAuthorized | None:
    """``NotAuthorized`` if this principal may not Describe ``topic``, else None (it exists or not, or Kafka
    did not answer: the caller's own path reports that).  ``topic_partitions`` without the partitions."""
    from confluent_kafka import KafkaException

    try:
        topic_partitions(admin, topic, config, operation, timeout)
    except NotAuthorized as exc:
        return exc
    except KafkaException:
        return None
    return None


def resource_of(err: Any) -> str | None:
    """The resource kind of a librdkafka ``KafkaError`` that is an authorization failure, else None."""
    if err is None:
        return None
    try:
        name = err.name()
    except Exception:  # not a KafkaError
        name = ""
    if name in _CODES:
        return _CODES[name]
    text = str(err.str() if hasattr(err, "str") else err).lower()
    for marker, resource in _TEXTS.items():
        if marker in text:
            return resource
    return None


def from_kafka_error(err: Any, config: dict[str, Any], operation: str, name: str | None = None,
                     topics: tuple[str, ...] = ()) -> NotAuthorized | None:
    """``NotAuthorized`` for an authorization ``KafkaError`` (else None).

    ``config``: the client's librdkafka config (principal = ``sasl.username``; group / transactional id
    are filled in for those resources when ``name`` is not given).  ``topics``: the topics the failed
    call involved, named when the broker's error does not say which one was refused.
    """
    resource = resource_of(err)
    if resource is None:
        return None
    if name is None:
        name = {"group": config.get("group.id"), "transactional id": config.get("transactional.id")}.get(resource)
    text = err.str() if hasattr(err, "str") else str(err)
    return NotAuthorized(config.get("sasl.username"), operation, resource, name, text,
                         tuple(topics) if resource == "topic" else ())
