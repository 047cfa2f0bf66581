"""Kafka authorization failures as one clear, final error: who may not do what on which resource, and the fix.

A missing ACL is not an outage: retrying never helps (until someone adds the ACL), so a stage that
meets one stops with ``NotAuthorized`` instead of aborting and re-reading its batch forever.  The
message names the principal, the operation, the resource and the fix (``sie acls plan``), never a
secret.  ``from_kafka_error`` recognises librdkafka's authorization error codes, and the text of an
abortable transaction error that carries one (a record refused by the broker makes
``commit_transaction`` fail with its reason).
"""

from __future__ import annotations

from typing import Any

from sie.kernel.errors import SieError

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
        super().__init__(
            f"not authorized: {who} may not {operation} {what} ({detail}); grant the ACL "
            f"(`sie acls plan --role ROLE --principal {principal or 'NAME'}` shows what each SIE role needs, "
            "docs/security.md)")


class NotAuthenticated(SieError):
    """The cluster refused this client's credentials (SASL or TLS): a configuration error, not an outage."""

    def __init__(self, bootstrap: str, principal: str | None, detail: str) -> None:
        who = f"user {principal!r}" if principal else "this client"
        super().__init__(
            f"Kafka at {bootstrap} refused the credentials of {who} ({detail}); check SIE_SASL_USERNAME and "
            "SIE_SASL_PASSWORD_FILE / SIE_SASL_PASSWORD (or the mTLS certificate, SIE_SSL_CA_LOCATION)")


#: librdkafka error names meaning "authentication failed" (error_cb), not "broker down"
AUTHENTICATION_ERRORS = frozenset({"_AUTHENTICATION", "SASL_AUTHENTICATION_FAILED", "_SSL"})


def topic_denied(admin: Any, topic: str, config: dict[str, Any], operation: str,
                 timeout: float = 10.0) -> NotAuthorized | None:
    """``NotAuthorized`` if this principal may not Describe ``topic``, else None (it exists or not).

    On a cluster with ACLs a topic the principal may not Describe is absent from the metadata, exactly
    like a missing one. ``describe_topics`` tells them apart and, unlike a metadata request naming the
    topic, never auto-creates it (``auto.create.topics.enable`` is on by default).
    """
    from confluent_kafka import KafkaException, TopicCollection

    try:
        futures = admin.describe_topics(TopicCollection([topic]), request_timeout=timeout)
        futures[topic].result(timeout=timeout)
    except KafkaException as exc:
        err = exc.args[0] if exc.args else None
        return from_kafka_error(err, config, operation, topic)
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
