"""One typed settings object for every SIE process.

The environment is read once, at the entry point (``Settings()`` in the CLI),
and the frozen object is passed down; no module reads ``os.environ`` on its own.
Every field can be overridden by an environment variable ``SIE_<FIELD>``
(e.g. ``SIE_BOOTSTRAP_SERVERS``).  Kafka security settings are passed through
unchanged to librdkafka so the same CLI works against a secured production
cluster.

Secrets (SASL passwords, API tokens, secret librdkafka properties) are ``SecretStr``: ``repr()``,
``str()``, logs and ``model_dump()`` show ``**********``; only the places that hand them to a
client (``kafka_client_config``) or to a child process (``to_env``) read the value.
"""

from __future__ import annotations

import json
import socket
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from sie.kernel.names import Names

#: librdkafka's debug contexts (CONFIGURATION.md, ``debug``): what SIE_KAFKA_DEBUG may name
KAFKA_DEBUG_CONTEXTS = frozenset({
    "generic", "broker", "topic", "metadata", "feature", "queue", "msg", "protocol", "cgrp", "security", "fetch",
    "interceptor", "plugin", "consumer", "admin", "eos", "mock", "assignor", "conf", "telemetry", "all"})

#: the demo's model package (examples/models/fraud): the only code a spec may name out of the box
DEFAULT_ALLOWED_MODULES = ("models.fraud",)
#: paths of the control API that may be served without a token when an operator asks for it
PUBLIC_PATH_CHOICES = ("/healthz", "/metrics")
API_ROLES = ("viewer", "operator")
_MODULE_RE_TEXT = r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$"


#: what an agent's workers get of its own environment besides SIE's settings (``worker_environment``): the process
#: basics and the compute stacks' knobs, never a name that looks like a credential (``_CREDENTIAL``) and never the
#: agent's other ``SIE_*`` variables; ``SIE_WORKER_ENV`` names more, passed as they are (e.g. ``HF_TOKEN``)
WORKER_ENV_NAMES = frozenset({
    "PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "TZ", "TMPDIR", "TERM", "PYTHONPATH",
    "PYTHONHASHSEED", "PYTHONIOENCODING", "VIRTUAL_ENV", "LD_LIBRARY_PATH", "SSL_CERT_FILE", "SSL_CERT_DIR",
    "HF_HOME", "HF_HUB_CACHE", "HF_HUB_OFFLINE", "TRANSFORMERS_CACHE", "TRANSFORMERS_OFFLINE", "COVERAGE_PROCESS_START",
})
WORKER_ENV_PREFIXES = ("LC_", "CUDA_", "NVIDIA_", "NCCL_", "OMP_", "MKL_", "OPENBLAS_", "TORCH_", "TORCHINDUCTOR_",
                       "PYTORCH_", "TRITON_", "SGLANG_", "FLASHINFER_")
_CREDENTIAL = ("TOKEN", "SECRET", "PASSW", "KEY", "CREDENTIAL", "AUTH")
#: settings an agent never hands its workers: the control API's (its token above all) and the workers' own
#: principal, which ``worker_settings`` has already applied
NOT_FOR_WORKERS = ("api_token", "api_tokens", "api_token_file", "api_tokens_file", "api_tls_cert", "api_tls_key",
                   "api_ca", "api_tls_server_name", "api_public_paths", "api_token_over_http", "worker_sasl_username", "worker_sasl_password",
                   "worker_sasl_password_file", "worker_uid", "worker_gid")


def looks_like_credential(name: str) -> bool:
    upper = name.upper()
    return any(word in upper for word in _CREDENTIAL)


class ApiTokenEntry(BaseModel):
    """One API token as the control plane stores it: a name, a role and the SHA-256 of the token.

    The token itself is never stored by the server (tokens are 256-bit random, so a plain SHA-256
    cannot be reversed or brute-forced; a slow password hash would only slow every request down).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(min_length=1, max_length=100, pattern=r"^[A-Za-z0-9._@-]+$")
    role: Literal["viewer", "operator"]
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    created_ms: int = 0


def _split_list(value: Any) -> Any:
    """A list setting from the environment: JSON (``'["a","b"]'``) or comma-separated (``a,b``)."""
    if isinstance(value, str):
        text = value.strip()
        if not text:
            return []
        if text.startswith("["):
            return json.loads(text)
        return [part.strip() for part in text.split(",") if part.strip()]
    return value


def _default_cache_dir() -> Path:
    return Path.home() / ".cache" / "sie"


class Settings(BaseSettings):
    """SIE configuration. Env prefix ``SIE_``; nested dicts as JSON."""

    # hide_input_in_errors: a bad SIE_* value is named, never echoed (it may be a password or a token)
    model_config = SettingsConfigDict(env_prefix="SIE_", frozen=True, extra="ignore", hide_input_in_errors=True)

    # --- Kafka connection -------------------------------------------------
    bootstrap_servers: str = Field(
        "127.0.0.1:9092", description="Kafka bootstrap servers (SIE_BOOTSTRAP_SERVERS)."
    )
    security_protocol: str | None = Field(
        None, description="librdkafka security.protocol: PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL."
    )
    sasl_mechanism: str | None = Field(None, description="sasl.mechanism, e.g. PLAIN, SCRAM-SHA-512.")
    sasl_username: str | None = Field(None, description="sasl.username.")
    sasl_password: SecretStr | None = Field(None, description="sasl.password (never shown; prefer SIE_SASL_PASSWORD_FILE).")
    sasl_password_file: Path | None = Field(
        None, description="File holding sasl.password (read when a client is built; wins over SIE_SASL_PASSWORD)."
    )
    ssl_ca_location: str | None = Field(None, description="ssl.ca.location (CA bundle path).")
    ssl_certificate_location: str | None = Field(None, description="ssl.certificate.location (mTLS client cert).")
    ssl_key_location: str | None = Field(None, description="ssl.key.location (mTLS client key).")
    ssl_key_password: SecretStr | None = Field(None, description="ssl.key.password of an encrypted client key.")
    kafka_extra: dict[str, str] = Field(
        default_factory=dict,
        description="Any other librdkafka property, as JSON (SIE_KAFKA_EXTRA='{\"ssl.endpoint.identification.algorithm\":\"none\"}').",
    )
    kafka_secrets: dict[str, SecretStr] = Field(
        default_factory=dict,
        description="librdkafka properties whose values are secrets, as JSON "
                    "(SIE_KAFKA_SECRETS='{\"sasl.oauthbearer.client.secret\":\"...\"}'); never shown.",
    )
    kafka_debug: str | None = Field(
        None,
        description="librdkafka debug contexts for every Kafka client of this process, comma-separated "
                    "(SIE_KAFKA_DEBUG=eos,protocol): their lines go to the process's log (logger sie.kafka, "
                    "DEBUG), unfiltered.  For reading an incident, not for steady operation (volume).",
    )
    # An agent's workers may run as another Kafka principal than the agent itself (least privilege:
    # the agent needs no access to model topics, the scorer none to the assignments topic).
    worker_sasl_username: str | None = Field(None, description="sasl.username of the workers an agent starts.")
    worker_sasl_password: SecretStr | None = Field(None, description="sasl.password of the agent's workers.")
    worker_sasl_password_file: Path | None = Field(None, description="File with the workers' sasl.password.")
    # The uid an agent runs its workers under (sie.workers.worker_user): model code then cannot read the agent's
    # own files (its Kafka password above all), only the copy of its own credential the agent hands it.
    worker_uid: int | None = Field(
        None, ge=1, description="Run an agent's workers as this unprivileged uid (SIE_WORKER_UID; the agent needs "
                                "CAP_SETUID, CAP_SETGID and CAP_CHOWN: on Kubernetes the chart's agent.workerUid). "
                                "Unset (default): workers run as the agent's own user.")
    worker_gid: int | None = Field(
        None, ge=1, description="The workers' gid with SIE_WORKER_UID (default: the same number); they get no "
                                "supplementary group.")

    worker_env: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Environment variables an agent passes to its workers as they are, besides the built-in "
                    "allow-list of process and compute-stack variables (SIE_WORKER_ENV=HF_TOKEN,MY_LICENSE_FILE); "
                    "default none. Nothing else of the agent's environment (its API token, other secrets) reaches "
                    "model code.")

    # --- What a spec may name (checked wherever a spec is read: CLI, API, control plane, agent, worker) ---
    allowed_modules: Annotated[list[str], NoDecode] = Field(
        default_factory=lambda: list(DEFAULT_ALLOWED_MODULES),
        description="Module prefixes a spec's backend.moduleClass / backend.callable may import "
                    "(SIE_ALLOWED_MODULES=models.fraud,acme.models). Standard-library modules are never allowed.",
    )
    model_roots: Annotated[list[Path] | None, NoDecode] = Field(
        None, description="Directories model artifacts must be under (SIE_MODEL_ROOTS=/srv/models,/opt/m); "
                          "default: <cache_dir>/models and the packaged demo models. The artifact cache "
                          "(<cache_dir>/artifacts, files fetched and verified by sha256) is always one.",
    )
    artifact_sources: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="URI prefixes a spec's artifact may be downloaded from, besides the cluster's artifacts topic "
                    "(SIE_ARTIFACT_SOURCES=s3://models/,https://models.example.com/); default none. file:// paths "
                    "must be under a model root instead.",
    )
    sglang_server_entries: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Command prefixes an sglang spec's backend.config.server_entry may name instead of "
                    "`python -m sglang.launch_server`, each a shell-quoted argv (SIE_SGLANG_SERVER_ENTRIES="
                    "'[\"/opt/sglang/bin/python -m sglang.launch_server\"]'); default none: a spec cannot choose "
                    "the program a node runs.")
    sglang_trust_remote_code: bool = Field(
        False, description="Let an sglang spec pass --trust-remote-code (SGLang then runs Python shipped with "
                            "the model's files); off by default.")
    sglang_extra_args: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="SGLang options an sglang spec's backend.config.extra_args may set on this node besides the "
                    "built-in allow-list (sie.schemas.sglang_args.ALLOWED_DESTS), as option strings or "
                    "destinations (SIE_SGLANG_EXTRA_ARGS=--chat-template,lora_paths); default none. The options SIE "
                    "sets itself (--model-path, --host, --port, ...) can never be allowed.")
    sglang_endpoints: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Servers an sglang spec's backend.config.server_url / endpoints may name (SGLang or "
                    "OpenAI-compatible servers a spec's requests are sent to): URL prefixes or host names (any port), "
                    "e.g. SIE_SGLANG_ENDPOINTS=http://10.0.0.5:30000/,https://llm.example.com/v1/,gpu-7.internal; "
                    "http(s) only; default none: a spec cannot send its requests to a server the node did not list.")
    max_artifact_bytes: int = Field(
        8 << 30, ge=1,
        description="Largest artifact `sie apply` uploads, the API accepts (PUT /v1/artifacts) and an agent fetches.",
    )

    # --- Control-plane HTTP API -------------------------------------------------------------------
    api_tokens_file: Path = Field(
        None, description="Hashed API tokens of the control plane (default: <cache_dir>/control/api-tokens.json)."
    )  # type: ignore[assignment]  # filled in by _derive_paths
    api_tokens: list[ApiTokenEntry] = Field(
        default_factory=list, description="More hashed API tokens, as JSON [{name, role, sha256}] (SIE_API_TOKENS)."
    )
    api_token: SecretStr | None = Field(None, description="Bearer token the CLI sends to a control plane (SIE_API_TOKEN).")
    api_token_file: Path = Field(
        None, description="Operator token written at the control plane's first start and read by a local CLI "
                          "when SIE_API_TOKEN is unset (default: <cache_dir>/control/operator.token, mode 0600).",
    )  # type: ignore[assignment]  # filled in by _derive_paths
    api_token_over_http: bool = Field(
        False, description="Let the CLI send SIE_API_TOKEN to a remote --control-url over plain http "
                           "(SIE_API_TOKEN_OVER_HTTP); off: only https or a loopback URL get a token.")
    api_tls_cert: Path | None = Field(None, description="PEM certificate of the control API (HTTPS when set).")
    api_tls_key: Path | None = Field(None, description="PEM private key of the control API.")
    api_ca: Path | None = Field(None, description="CA bundle the CLI verifies an HTTPS control API against.")
    api_tls_server_name: str | None = Field(
        None, pattern=r"^[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$",
        description="The name an HTTPS control API's certificate is checked against when --control-url names "
                    "another address, e.g. a pod IP (SIE_API_TLS_SERVER_NAME; kubectl's tls-server-name).")
    api_public_paths: Annotated[list[str], NoDecode] = Field(
        default_factory=list, description="API paths served without a token: any of /healthz, /metrics (default: none)."
    )

    connect_timeout_s: float = Field(
        5.0, gt=0,
        description="How long a command waits for the first answer of Kafka before it gives up with one line "
                    "naming the servers (SIE_CONNECT_TIMEOUT_S).")

    # --- Observability (docs/observability.md) ---------------------------------------------------
    tracing: Literal["off", "otlp", "console"] = Field(
        "off", description="OpenTelemetry tracing of requests (traceparent in Kafka headers): off (default, no cost), "
                           "otlp (export to SIE_OTLP_ENDPOINT) or console (print spans).")
    otlp_endpoint: str = Field(
        "http://127.0.0.1:4318/v1/traces", description="OTLP/HTTP traces endpoint when SIE_TRACING=otlp.")
    trace_sample_ratio: float = Field(
        1.0, ge=0.0, le=1.0,
        description="Share of the traces SIE starts (sie produce, CDC rows) that are recorded; a request that "
                    "arrives with a traceparent follows its sampled flag.")
    metrics_bind: str = Field(
        "127.0.0.1", description="Address the /metrics servers of the agent, its workers, scorers and the CDC and "
                                 "LLM stages bind. Loopback by default (read-only and unauthenticated, so not "
                                 "exposed unless told); set 0.0.0.0 or the node's address when Prometheus "
                                 "scrapes from another host.")
    advertise_host: str | None = Field(
        None, description="Host name or address Prometheus reaches this node's /metrics endpoints at (the agent's "
                          "and its workers'), as the control plane's service discovery lists them; default: "
                          "127.0.0.1 while SIE_METRICS_BIND is loopback, this machine's host name when it is "
                          "0.0.0.0/::, else SIE_METRICS_BIND itself.")

    # --- Placement: host memory a replica's process costs beyond its spec's memoryMb --------------
    # (control/placement/host_memory.py applies them; docs/architecture.md "Placement with host memory")
    process_overhead_mb: int = Field(
        579, ge=0,
        description="Host memory (MiB) of a worker process of its own, before any model: one `sie score` process "
                    "(torch, its libraries, one Kafka consumer and producer; docs/control-plane.md). Counted "
                    "for every replica that does not share a process (SIE_PROCESS_OVERHEAD_MB).")
    model_overhead_mb: int = Field(
        25, ge=0,
        description="Host memory (MiB) one more model costs in a shared multi-model worker process: the target "
                    "that bench/bench_density.py measures (docs/density.md; SIE_MODEL_OVERHEAD_MB).")

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

    # --- Multi-model worker processes (sie.workers.multimodel, docs/density.md) -------------------------------
    shared_processes: int = Field(
        0, ge=0, description="Models one shared multi-model worker process of a node agent hosts (P1/P2 torch/python "
                             "models without whole GPUs; docs/density.md). 0 (default): every replica runs in a "
                             "worker process of its own. The agent reports it in heartbeats (shared_process_slots).")
    shared_process_threads: int = Field(
        2, ge=1, description="torch intra-op threads of one multi-model worker process, shared by all its models "
                             "(torch.set_num_threads): one busy model cannot take every core of the node.")
    shared_lane_hang_s: float = Field(
        30.0, gt=0, description="An inference call of a model in a multi-model process that runs longer than this "
                                "is reported as hung and the model's lane is restarted (the hung thread is fenced).")

    # --- Rollouts: the other version a replica serves (sie.workers.versions, docs/rollouts.md) -------------
    companion_call_timeout_s: float = Field(
        10.0, gt=0, description="During a rollout each replica serves the other version from a process of its own; "
                                "a call to it that does not answer within this long counts as a hang: the process is "
                                "killed, the batch is refused (no other version answers its rows), the replica hands its "
                                "partitions to the replicas that serve every version until it is ready again, and the "
                                "version is reported lost (the leader rolls a lost canary back).")
    companion_load_timeout_s: float = Field(
        300.0, gt=0, description="How long the other version of a rollout may take to load and pass its readiness "
                                 "inference in its process before it is reported failed.")

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
    kafka_jit: Literal["quick", "full"] = Field(
        "quick",
        description="JIT of a local broker's JVM. quick: the C1 compiler only (-XX:TieredStopAtLevel=1): the broker "
                    "starts on ~45 % less CPU and spends ~35 % less on a short workload, where C2's compiling never "
                    "pays back (measured: docs/development.md); full: C1 + C2, for long runs at peak throughput "
                    "(the benchmarks use it).",
    )

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
            if not values.get("api_tokens_file"):
                values["api_tokens_file"] = cache / "control" / "api-tokens.json"
            if not values.get("api_token_file"):
                values["api_token_file"] = cache / "control" / "operator.token"
        return values

    @field_validator("allowed_modules", "api_public_paths", "artifact_sources", "sglang_server_entries",
                     "sglang_extra_args", "sglang_endpoints", "worker_env", mode="before")
    @classmethod
    def _parse_list(cls, value: Any) -> Any:
        return _split_list(value)

    @field_validator("model_roots", mode="before")
    @classmethod
    def _parse_roots(cls, value: Any) -> Any:
        return None if value is None else _split_list(value)

    @field_validator("allowed_modules")
    @classmethod
    def _check_modules(cls, value: list[str]) -> list[str]:
        """A prefix is a dotted module name, never empty (that would allow everything) nor the standard library."""
        import re

        for prefix in value:
            if not re.fullmatch(_MODULE_RE_TEXT, prefix):
                raise ValueError(f"SIE_ALLOWED_MODULES: {prefix!r} is not a dotted module name (e.g. acme.models)")
            top = prefix.split(".")[0]
            if top in sys.stdlib_module_names or top in sys.builtin_module_names:
                raise ValueError(f"SIE_ALLOWED_MODULES: {prefix!r} is in the Python standard library; a spec "
                                 "may only name model code (e.g. acme.models)")
            if top == "sie":
                raise ValueError(f"SIE_ALLOWED_MODULES: {prefix!r} is SIE itself; a spec may only name model code")
        return value

    @field_validator("artifact_sources")
    @classmethod
    def _check_sources(cls, value: list[str]) -> list[str]:
        """A source is ``scheme://`` plus at least a host or bucket: a bare ``https://`` would allow the internet."""
        import re

        for source in value:
            match = re.match(r"([a-z][a-z0-9+.-]*)://([^/\s]+)", source)
            if match is None or match.group(1) == "file":
                raise ValueError(f"SIE_ARTIFACT_SOURCES: {source!r} must be a URI prefix with a host or bucket, "
                                 "e.g. s3://models/ or https://models.example.com/ (file:// paths go under "
                                 "SIE_MODEL_ROOTS instead)")
        return value

    @field_validator("sglang_endpoints")
    @classmethod
    def _check_endpoints(cls, value: list[str]) -> list[str]:
        """An endpoint is ``http(s)://host[:port][/path]`` or a host name: a bare ``https://`` would allow any server."""
        import re

        for prefix in value:
            if not re.fullmatch(r"https?://[^/@\s]+(/\S*)?", prefix) and not re.fullmatch(r"[A-Za-z0-9.-]+|\[[0-9A-Fa-f:.]+\]", prefix):
                raise ValueError(f"SIE_SGLANG_ENDPOINTS: {prefix!r} must be an http(s) URL prefix with a host and no "
                                 "credentials (http://10.0.0.5:30000/, https://llm.example.com/v1/) or a host name")
        return value

    @field_validator("api_public_paths")
    @classmethod
    def _check_public(cls, value: list[str]) -> list[str]:
        for path in value:
            if path not in PUBLIC_PATH_CHOICES:
                raise ValueError(f"SIE_API_PUBLIC_PATHS: {path!r} cannot be public; choose from {', '.join(PUBLIC_PATH_CHOICES)}")
        return value

    @field_validator("kafka_debug")
    @classmethod
    def _check_kafka_debug(cls, value: str | None) -> str | None:
        """An allow-list of librdkafka's debug contexts: a typo would otherwise fail every client at creation."""
        if value is None or not value.strip():
            return None
        contexts = [c.strip() for c in value.split(",") if c.strip()]
        unknown = sorted(set(contexts) - KAFKA_DEBUG_CONTEXTS)
        if unknown:
            raise ValueError(f"SIE_KAFKA_DEBUG: unknown librdkafka debug context(s) {unknown}; choose from "
                             f"{', '.join(sorted(KAFKA_DEBUG_CONTEXTS))} (e.g. eos,protocol)")
        return ",".join(contexts)

    @field_validator("kafka_extra", mode="before")
    @classmethod
    def _parse_extra(cls, value: Any) -> Any:
        if isinstance(value, str):
            return json.loads(value) if value.strip() else {}
        return value

    def kafka_client_config(self, **overrides: Any) -> dict[str, Any]:
        """librdkafka configuration shared by every producer, consumer and admin client.

        ``logger`` routes librdkafka's own log lines through the ``sie.kafka`` Python logger
        (``sie.kernel.kafka_log``), so they are levelled, de-duplicated and never printed raw;
        ``kafka_debug`` (SIE_KAFKA_DEBUG) adds librdkafka's ``debug`` contexts, logged at DEBUG.
        """
        from sie.kernel.kafka_log import kafka_logger

        config: dict[str, Any] = {"bootstrap.servers": self.bootstrap_servers,
                                  "logger": kafka_logger(debug=self.kafka_debug is not None)}
        if self.kafka_debug is not None:  # SIE_KAFKA_DEBUG: librdkafka's debug lines in this process's log
            config["debug"] = self.kafka_debug
        passthrough = {
            "security.protocol": self.security_protocol,
            "sasl.mechanism": self.sasl_mechanism,
            "sasl.username": self.sasl_username,
            "sasl.password": self.sasl_password_value(),
            "ssl.ca.location": self.ssl_ca_location,
            "ssl.certificate.location": self.ssl_certificate_location,
            "ssl.key.location": self.ssl_key_location,
            "ssl.key.password": self.ssl_key_password.get_secret_value() if self.ssl_key_password else None,
        }
        config.update({k: v for k, v in passthrough.items() if v is not None})
        config.update(self.kafka_extra)
        config.update({k: v.get_secret_value() for k, v in self.kafka_secrets.items()})
        config.update(overrides)
        return config

    def sasl_password_value(self) -> str | None:
        """The SASL password: from ``sasl_password_file`` when set (read now, so a rotated file is picked
        up by the next client), else ``sasl_password``."""
        from sie.kernel.errors import ConfigError

        if self.sasl_password_file is not None:
            try:
                return self.sasl_password_file.read_text(encoding="utf-8").strip()
            except OSError as exc:
                raise ConfigError(f"SIE_SASL_PASSWORD_FILE: cannot read {self.sasl_password_file} "
                                  f"({exc.strerror or exc}); check the path and its permissions") from None
        value: Any = self.sasl_password  # a str when set through model_copy/with_overrides (not validated)
        return value.get_secret_value() if isinstance(value, SecretStr) else value

    def worker_settings(self) -> Settings:
        """The settings an agent hands its workers: its own, with the workers' Kafka principal if one is set."""
        if not self.worker_sasl_username:
            return self
        return self.model_copy(update={
            "sasl_username": self.worker_sasl_username,
            "sasl_password": self.worker_sasl_password,
            "sasl_password_file": self.worker_sasl_password_file,
            "worker_sasl_username": None, "worker_sasl_password": None, "worker_sasl_password_file": None,
        })

    def worker_environment(self, parent: Mapping[str, str]) -> dict[str, str]:
        """The environment an agent gives its workers: ``parent``'s allow-listed variables (``WORKER_ENV_NAMES``,
        ``WORKER_ENV_PREFIXES``, never a credential-like name; plus ``SIE_WORKER_ENV``) and the workers' settings
        (``worker_settings().to_env()``) without ``NOT_FOR_WORKERS``.  Model code and the SGLang server run
        there, so they must not inherit the agent's whole environment (``SIE_API_TOKEN`` included)."""
        return {**worker_environment(parent, self.worker_env),
                **{k: v for k, v in self.worker_settings().to_env().items()
                   if k not in {f"SIE_{n.upper()}" for n in NOT_FOR_WORKERS}}}

    def to_env(self) -> dict[str, str]:
        """These settings as ``SIE_*`` variables, for child processes (an agent's workers).

        A child reads its settings from the environment at its entry point; passing them explicitly
        means a CLI option or an in-process override reaches it too (not only what the parent's own
        environment happened to say).
        """
        env: dict[str, str] = {}
        for name in type(self).model_fields:
            value = _plain(getattr(self, name))
            if value is None:
                continue
            key = f"SIE_{name.upper()}"
            env[key] = json.dumps(value) if isinstance(value, (dict, list)) else str(value)
        return env

    @property
    def artifact_cache_dir(self) -> Path:
        """Where an agent keeps artifacts it fetched and verified, one folder per sha256 (always a model root)."""
        return self.cache_dir / "artifacts"

    @property
    def metrics_host(self) -> str:
        """Where Prometheus reaches this node's /metrics servers: SIE_ADVERTISE_HOST, else derived from
        SIE_METRICS_BIND so service discovery never lists an address the servers do not listen on."""
        if self.advertise_host:
            return self.advertise_host
        bind = self.metrics_bind.strip("[]")
        if bind in ("0.0.0.0", "::", ""):
            return socket.gethostname()
        return bind

    @property
    def names(self) -> Names:
        """Every topic/group/transactional-id name of this cluster (one place builds them all)."""
        return Names(self.topic_prefix)

    def with_overrides(self, **changes: Any) -> Settings:
        """A copy with some fields changed (CLI options override env)."""
        return self.model_copy(update={k: v for k, v in changes.items() if v is not None})


def worker_environment(parent: Mapping[str, str], extra: Iterable[str] = ()) -> dict[str, str]:
    """``parent``'s variables a worker may inherit (``Settings.worker_environment`` adds SIE's own settings)."""
    named = set(extra)
    return {k: v for k, v in parent.items()
            if k in named or ((k in WORKER_ENV_NAMES or k.startswith(WORKER_ENV_PREFIXES)) and not looks_like_credential(k))}


#: the settings a companion version process (``sie.workers.version_host``) needs: it loads and serves one version
#: over pipes (the node's spec policy, the model roots and caches, its compute knobs) and never talks to Kafka or
#: the control API, so no connection setting or credential is on this allow-list
COMPANION_SETTINGS = ("allowed_modules", "model_roots", "artifact_sources", "sglang_endpoints", "sglang_server_entries",
                      "sglang_trust_remote_code", "sglang_extra_args", "cache_dir", "topic_prefix", "worker_env")


def companion_environment(parent: Mapping[str, str]) -> dict[str, str]:
    """What a worker's companion version process gets of the worker's environment ``parent``: the worker
    allow-list (``worker_environment`` with ``SIE_WORKER_ENV``'s names) and, of SIE's settings, only those on
    ``COMPANION_SETTINGS``: never the worker's Kafka credentials (it inherited the worker's whole environment)."""
    named = [str(n) for n in _split_list(parent.get("SIE_WORKER_ENV", ""))]
    allowed = {f"SIE_{name.upper()}" for name in COMPANION_SETTINGS if name in Settings.model_fields}
    base = {k: v for k, v in worker_environment(parent, named).items() if not k.startswith("SIE_")}
    return {**base, **{k: v for k, v in parent.items() if k in allowed}}


def child_environment(parent: Mapping[str, str]) -> dict[str, str]:
    """What a worker's own helper process (the SGLang server) gets of the worker's environment ``parent``: the same
    allow-list and the variables ``SIE_WORKER_ENV`` names (e.g. ``HF_TOKEN`` for a gated model's download), never
    SIE's settings (the worker's Kafka credentials among them)."""
    named = [str(n) for n in _split_list(parent.get("SIE_WORKER_ENV", ""))]
    return {k: v for k, v in worker_environment(parent, named).items() if not k.startswith("SIE_")}


def _plain(value: Any) -> Any:
    """A settings value as plain data for ``to_env`` (secrets revealed: the child needs them)."""
    if isinstance(value, SecretStr):
        return value.get_secret_value()
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value
