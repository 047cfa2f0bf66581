"""One typed settings object for every SIE process.

The environment is read once, at the entry point (``Settings()`` in the CLI),
and the frozen object is passed down; no module reads ``os.environ`` on its own.
Every field can be overridden by an environment variable ``SIE_<FIELD>``
(e.g. ``SIE_BOOTSTRAP_SERVERS``).  Kafka security settings are passed through
unchanged to librdkafka so the same CLI works against a secured production
cluster.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from sie.kernel.names import Names


def _default_cache_dir() -> Path:
    return Path.home() / ".cache" / "sie"


class Settings(BaseSettings):
    """SIE configuration. Env prefix ``SIE_``; nested dicts as JSON."""

    model_config = SettingsConfigDict(env_prefix="SIE_", frozen=True, extra="ignore")

    # --- Kafka connection -------------------------------------------------
    bootstrap_servers: str = Field(
        "127.0.0.1:9092", description="Kafka bootstrap servers (SIE_BOOTSTRAP_SERVERS)."
    )
    security_protocol: str | None = Field(
        None, description="librdkafka security.protocol: PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL."
    )
    sasl_mechanism: str | None = Field(None, description="sasl.mechanism, e.g. PLAIN, SCRAM-SHA-512.")
    sasl_username: str | None = Field(None, description="sasl.username.")
    sasl_password: str | None = Field(None, description="sasl.password.")
    ssl_ca_location: str | None = Field(None, description="ssl.ca.location (CA bundle path).")
    ssl_certificate_location: str | None = Field(None, description="ssl.certificate.location.")
    ssl_key_location: str | None = Field(None, description="ssl.key.location.")
    kafka_extra: dict[str, str] = Field(
        default_factory=dict,
        description="Any other librdkafka property, as JSON (SIE_KAFKA_EXTRA='{\"ssl.endpoint.identification.algorithm\":\"none\"}').",
    )

    connect_timeout_s: float = Field(
        5.0, gt=0,
        description="How long a command waits for the first answer of Kafka before it gives up with one line "
                    "naming the servers (SIE_CONNECT_TIMEOUT_S).")

    # --- Topics -------------------------------------------------------------
    topic_prefix: str = Field("sie", description="Prefix of SIE's system topics and default model topics.")
    replication_factor: int | None = Field(
        None, description="Replication of SIE's topics; default: 3 when the cluster has >= 3 brokers, else 1."
    )
    request_partitions: int = Field(6, description="Default partition count of a model's request/result topics.")

    # --- Sizes (docs/reliability.md has the whole table) -----------------------------------
    max_record_bytes: int = Field(
        1_048_576, ge=65_536,
        description="The largest record SIE writes: every producer's message.max.bytes; topics SIE creates get "
                    "max.message.bytes = this + 1 KiB. Kept under the broker default (1,048,588) so SIE's records "
                    "also fit topics it did not create. Dead letters are cut down to fit it.")
    max_request_bytes: int = Field(
        1_000_000, ge=1,
        description="Larger request values are dead-lettered as too_large; smaller than max_record_bytes so a "
                    "request's result (its metadata copied in) has room.")

    # --- Local state ----------------------------------------------------------
    cache_dir: Path = Field(
        default_factory=_default_cache_dir,
        description="Root of SIE's local files (Kafka jars and data, agent and demo work directories); "
                    "SIE_CACHE_DIR. Nothing is written next to the installed package.",
    )

    # --- Local Kafka (sie kafka up) -----------------------------------------
    kafka_version: str = Field("4.1.1", description="Apache Kafka version resolved from Maven Central.")
    kafka_cache_dir: Path = Field(
        None, description="Where Maven copies the broker jars, once per machine (default: <cache_dir>/kafka)."
    )  # type: ignore[assignment]  # filled in by _derive_paths
    kafka_data_dir: Path = Field(
        None, description="Broker data and logs for `sie kafka up` (default: <cache_dir>/kafka-run)."
    )  # type: ignore[assignment]  # filled in by _derive_paths
    kafka_heap: str = Field("512m", description="Heap per local broker.")

    @model_validator(mode="before")
    @classmethod
    def _derive_paths(cls, values: Any) -> Any:
        """Paths left unset derive from ``cache_dir`` (itself overridable), never from the source tree."""
        if isinstance(values, dict):
            cache = Path(values.get("cache_dir") or _default_cache_dir())
            values = {**values, "cache_dir": cache}
            if not values.get("kafka_cache_dir"):
                values["kafka_cache_dir"] = cache / "kafka"
            if not values.get("kafka_data_dir"):
                values["kafka_data_dir"] = cache / "kafka-run"
        return values

    @field_validator("kafka_extra", mode="before")
    @classmethod
    def _parse_extra(cls, value: Any) -> Any:
        if isinstance(value, str):
            return json.loads(value) if value.strip() else {}
        return value

    def kafka_client_config(self, **overrides: Any) -> dict[str, Any]:
        """librdkafka configuration shared by every producer, consumer and admin client.

        ``logger`` routes librdkafka's own log lines through the ``sie.kafka`` Python logger
        (``sie.kernel.kafka_log``), so they are levelled, de-duplicated and never printed raw.
        """
        from sie.kernel.kafka_log import kafka_logger

        config: dict[str, Any] = {"bootstrap.servers": self.bootstrap_servers, "logger": kafka_logger()}
        passthrough = {
            "security.protocol": self.security_protocol,
            "sasl.mechanism": self.sasl_mechanism,
            "sasl.username": self.sasl_username,
            "sasl.password": self.sasl_password,
            "ssl.ca.location": self.ssl_ca_location,
            "ssl.certificate.location": self.ssl_certificate_location,
            "ssl.key.location": self.ssl_key_location,
        }
        config.update({k: v for k, v in passthrough.items() if v is not None})
        config.update(self.kafka_extra)
        config.update(overrides)
        return config

    def to_env(self) -> dict[str, str]:
        """These settings as ``SIE_*`` variables, for child processes (an agent's workers).

        A child reads its settings from the environment at its entry point; passing them explicitly
        means a CLI option or an in-process override reaches it too (not only what the parent's own
        environment happened to say).
        """
        env: dict[str, str] = {}
        for name, value in self.model_dump().items():
            if value is None:
                continue
            key = f"SIE_{name.upper()}"
            env[key] = json.dumps(value) if isinstance(value, dict) else str(value)
        return env

    @property
    def names(self) -> Names:
        """Every topic/group/transactional-id name of this cluster (one place builds them all)."""
        return Names(self.topic_prefix)

    def with_overrides(self, **changes: Any) -> Settings:
        """A copy with some fields changed (CLI options override env)."""
        return self.model_copy(update={k: v for k, v in changes.items() if v is not None})
