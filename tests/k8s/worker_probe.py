"""What model code in a worker of the chart's agent pod can reach, seen from inside that pod.

Not a test module: tests/k8s/test_pods_secured.py feeds it to ``kubectl exec -i <agent pod> -c agent -- python3 -
WORKER_UID PREFIX RESULTS`` (the image's own Python, confluent-kafka and ``sie``). It starts as the agent
container's root (only CAP_SETUID/SETGID/CHOWN, no CAP_DAC_OVERRIDE), lists the container's processes, then drops
for good to the worker uid with no group, exactly what a worker is, and as that user::

    environ  <- /proc/<worker pid>/environ          (readable by the same uid: what the worker was given)
    files    <- open() each credential path         (the agent's Secret, the workers' Secret, the worker's copy)
    kafka    <- a producer/admin client built from the worker's own SIE_* settings:
                write <prefix>.specs / assignments / artifact-chunks / rollouts, alter <prefix>.specs' retention,
                write its model's results topic

and prints one JSON object (no secret: a password appears only as its SHA-256).
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import sys
from typing import Any

#: the credential files of the agent pod (the chart's sie.kafkaMounts)
AGENT_SECRET = "/etc/sie/kafka-user/password"
WORKERS_SECRET = "/etc/sie/kafka-workers/password"
SERVICE_ACCOUNT_TOKEN = "/var/run/secrets/kubernetes.io/serviceaccount/token"


def processes() -> list[dict[str, Any]]:
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
            with open(f"/proc/{entry}/status", encoding="utf-8") as f:
                status = dict(line.split(":", 1) for line in f.read().splitlines() if ":" in line)
        except OSError:
            continue
        if not cmdline:
            continue
        out.append({"pid": int(entry), "cmdline": cmdline[:300], "uid": int(status["Uid"].split()[0]),
                    "euid": int(status["Uid"].split()[1]), "groups": status["Groups"].split(),
                    "cap_eff": status["CapEff"].strip(), "no_new_privs": status["NoNewPrivs"].strip()})
    return out


def try_open(path: str) -> str:
    """``sha256:<hex>`` of the stripped contents, or the errno's name (``EACCES``, ``ENOENT``)."""
    try:
        with open(path, "rb") as f:
            return "sha256:" + hashlib.sha256(f.read().strip()).hexdigest()
    except OSError as exc:
        return errno.errorcode.get(exc.errno or 0, str(exc))


def produce(config: dict[str, Any], topic: str) -> str:
    """``ok`` or the broker's error name for one record written to ``topic``."""
    from confluent_kafka import Producer

    outcome: list[str] = []
    producer = Producer({**config, "enable.idempotence": False, "acks": "all", "message.timeout.ms": 20000})
    producer.produce(topic, json.dumps({"id": "probe-worker", "probe": True}).encode(), key=b"probe-worker",
                     on_delivery=lambda err, _msg: outcome.append("ok" if err is None else err.name()))
    producer.flush(30)
    return outcome[0] if outcome else "no delivery report"


def alter_retention(config: dict[str, Any], topic: str) -> str:
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

    admin = AdminClient(config)
    resource = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=[
        ConfigEntry("retention.ms", "1000", incremental_operation=AlterConfigOpType.SET)])
    try:
        for future in admin.incremental_alter_configs([resource], request_timeout=20).values():
            future.result(timeout=30)
    except KafkaException as exc:
        return str(exc.args[0].name())
    return "ok"


def main(worker_uid: int, prefix: str, results_topic: str) -> dict[str, Any]:
    report: dict[str, Any] = {"processes": processes()}
    workers = [p for p in report["processes"] if "sie.workers." in p["cmdline"]]
    # for good: no group, the worker's uid and gid (the agent starts its workers the same way)
    os.setgroups([])
    os.setgid(worker_uid)
    os.setuid(worker_uid)
    report["probe_uid"] = [os.getuid(), os.geteuid(), os.getgid(), os.getgroups()]
    env: dict[str, str] = {}
    if workers:
        with open(f"/proc/{workers[0]['pid']}/environ", "rb") as f:
            env = dict(kv.decode().split("=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
    report["worker_env_keys"] = sorted(env)
    report["worker_env"] = {k: env.get(k) for k in ("SIE_SASL_USERNAME", "SIE_SASL_PASSWORD_FILE",
                                                    "SIE_SECURITY_PROTOCOL", "SIE_SSL_CA_LOCATION")}
    own = env.get("SIE_SASL_PASSWORD_FILE", "")
    report["open"] = {"agent": try_open(AGENT_SECRET), "workers_secret": try_open(WORKERS_SECRET),
                      "own_copy": try_open(own) if own else "no SIE_SASL_PASSWORD_FILE",
                      "service_account_token": try_open(SERVICE_ACCOUNT_TOKEN)}
    if env:
        os.environ.clear()
        os.environ.update({k: v for k, v in env.items() if k.startswith("SIE_") or k in ("PATH", "PYTHONPATH", "HOME")})
        from sie.kernel.settings import Settings

        config = Settings().kafka_client_config()
        report["kafka"] = {**{f"write {prefix}.{s}": produce(config, f"{prefix}.{s}")
                              for s in ("specs", "assignments", "artifact-chunks", "rollouts")},
                           f"alter {prefix}.specs retention.ms": alter_retention(config, f"{prefix}.specs"),
                           f"write {results_topic}": produce(config, results_topic)}
    return report


if __name__ == "__main__":
    print(json.dumps(main(int(sys.argv[1]), sys.argv[2], sys.argv[3])))
