"""Hole 11: workers (model code) and the SGLang server inherited the agent's whole environment, ``SIE_API_TOKEN``
included.  Now a worker's environment is built from an allow-list (process basics, compute-stack knobs, never a
credential-like name, plus ``SIE_WORKER_ENV``) and the workers' settings without the control API's; the SGLang
server a worker starts gets no SIE setting and no credential at all.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from sie.kernel.settings import Settings
from sie.workers.agent.launch import WorkerCommandBuilder
from sie.workers.backends.base import BackendConfig, BackendError, FieldRef
from sie.workers.backends.sglang_backend import SGLangBackend
from sie.workers.replica import DesiredReplica

AGENT_ENV = {
    "PATH": "/usr/bin", "HOME": "/home/sie", "LC_ALL": "C.UTF-8", "CUDA_HOME": "/usr/local/cuda",
    "OMP_NUM_THREADS": "2", "SGLANG_LOG_LEVEL": "info",
    "SIE_API_TOKEN": "sie_operator-secret", "SIE_API_TOKENS": "[]", "SIE_SOMETHING_UNKNOWN": "x",
    "AWS_SECRET_ACCESS_KEY": "aws-secret", "GITHUB_TOKEN": "gh-secret", "HF_TOKEN": "hf-secret",
    "CUDA_AUTH_KEY": "looks-like-a-key", "DATABASE_URL": "postgres://u:pw@db/x",
}
SECRETS = ("sie_operator-secret", "aws-secret", "gh-secret", "hf-secret", "looks-like-a-key", "postgres://")


def _env(settings: Settings, tmp_path: Path) -> dict[str, str]:
    builder = WorkerCommandBuilder(tmp_path, base_env=AGENT_ENV, settings=settings)
    return dict(builder(DesiredReplica("m-0", "m", "1", json.dumps({}))).env)


def test_a_worker_gets_an_allow_listed_environment_and_never_the_agents_api_token(tmp_path: Path):
    agent = Settings(cache_dir=tmp_path / "c", api_token="sie_operator-secret", sasl_username="agent",
                     sasl_password="agent-pw", worker_sasl_username="scorer", worker_sasl_password="scorer-pw")
    env = _env(agent, tmp_path)
    assert not [k for k, v in env.items() if any(secret in v for secret in SECRETS)]
    assert not {"SIE_API_TOKEN", "SIE_API_TOKENS", "SIE_API_TOKEN_FILE", "SIE_SOMETHING_UNKNOWN",
                "SIE_WORKER_SASL_PASSWORD", "AWS_SECRET_ACCESS_KEY", "GITHUB_TOKEN", "HF_TOKEN"} & set(env)
    assert {k: env[k] for k in ("PATH", "HOME", "LC_ALL", "CUDA_HOME", "OMP_NUM_THREADS", "SGLANG_LOG_LEVEL")} == \
        {k: AGENT_ENV[k] for k in ("PATH", "HOME", "LC_ALL", "CUDA_HOME", "OMP_NUM_THREADS", "SGLANG_LOG_LEVEL")}
    # what a worker needs of SIE: the cluster, as ITS principal
    assert env["SIE_SASL_USERNAME"] == "scorer" and env["SIE_SASL_PASSWORD"] == "scorer-pw"
    assert "agent-pw" not in env.values()


def test_an_operator_names_more_variables_explicitly(tmp_path: Path):
    env = _env(Settings(cache_dir=tmp_path / "c", worker_env=["HF_TOKEN"]), tmp_path)
    assert env["HF_TOKEN"] == "hf-secret" and "GITHUB_TOKEN" not in env


def test_the_sglang_server_gets_no_sie_setting_and_no_credential(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    for key, value in {**AGENT_ENV, "SIE_SASL_PASSWORD": "scorer-pw", "SIE_BOOTSTRAP_SERVERS": "k:9092"}.items():
        monkeypatch.setenv(key, value)
    seen: dict[str, Any] = {}

    class Exited:
        pid, returncode = 4242, 1

        def poll(self) -> int:
            return 1

    def spawn(argv: Any, env: Any = None, log_path: Any = None) -> Exited:
        seen["env"] = env
        return Exited()

    config = BackendConfig(type="sglang", model_path="m", model_id="m:1", config={"mem_fraction_static": 0.3},
                           output_fields=(FieldRef("answer", "string"),))
    with pytest.raises(BackendError, match="SGLang server .pid 4242."):
        SGLangBackend(config, spawn=spawn).load()
    env = seen["env"]
    assert env is not None and env["PATH"] == "/usr/bin"
    assert not [k for k in env if k.startswith("SIE_")]
    assert not [k for k, v in env.items() if any(s in v for s in (*SECRETS, "scorer-pw"))]


def test_a_companion_version_process_gets_the_allow_list_and_no_kafka_credential(tmp_path: Path,
                                                                               monkeypatch: pytest.MonkeyPatch):
    """Issue 37, item 1: a worker's companion process (the other version of a rollout, ``VersionHost``) inherited
    the worker's whole environment: its Kafka password among it, readable by the other version's model code."""
    from sie.workers.versions import VersionHost

    worker = {**AGENT_ENV, "SIE_SASL_USERNAME": "scorer", "SIE_SASL_PASSWORD": "scorer-pw",
              "SIE_SASL_PASSWORD_FILE": "/etc/sie/kafka-user/password", "SIE_SSL_KEY_PASSWORD": "key-pw",
              "SIE_KAFKA_SECRETS": '{"sasl.oauthbearer.client.secret": "oauth-secret"}',
              "SIE_BOOTSTRAP_SERVERS": "k:9092", "SIE_ALLOWED_MODULES": "acme.models", "SIE_TOPIC_PREFIX": "blue",
              "SIE_MODEL_ROOTS": "/models"}
    for key, value in worker.items():
        monkeypatch.setenv(key, value)
    host = VersionHost("1.1.0", tmp_path / "version-1.1.0.json", "m-0 version 1.1.0", log_path=tmp_path / "v.log",
                       call_timeout_s=1.0)
    env = host._env
    assert env is not None
    assert not [k for k, v in env.items() if any(s in v for s in (*SECRETS, "scorer-pw", "key-pw", "oauth-secret"))]
    assert not {"SIE_SASL_USERNAME", "SIE_SASL_PASSWORD_FILE", "SIE_BOOTSTRAP_SERVERS", "SIE_API_TOKEN"} & set(env)
    assert {k: env[k] for k in ("PATH", "SIE_ALLOWED_MODULES", "SIE_TOPIC_PREFIX", "SIE_MODEL_ROOTS")} == \
        {k: worker[k] for k in ("PATH", "SIE_ALLOWED_MODULES", "SIE_TOPIC_PREFIX", "SIE_MODEL_ROOTS")}


def test_the_launchers_never_hand_a_child_the_whole_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """An empty LaunchSpec.env used to mean "inherit everything" (``env or None``), and ``spawn_child`` without
    ``env`` inherited the worker's whole environment: both now pass only what the allow-list built."""
    import sys

    from sie.workers.process import LaunchSpec, SubprocessLauncher, spawn_child

    monkeypatch.setenv("SIE_SASL_PASSWORD", "scorer-pw")
    monkeypatch.setenv("GITHUB_TOKEN", "gh-secret")
    dump = "import json, os, sys; json.dump(dict(os.environ), open(sys.argv[1], 'w'))"
    handle = SubprocessLauncher().start(LaunchSpec(name="w", argv=(sys.executable, "-c", dump, str(tmp_path / "a")),
                                                   env={"ONLY": "this"}, status_pipe=False))
    handle._popen.wait(60)
    seen = json.loads((tmp_path / "a").read_text())
    assert "scorer-pw" not in seen.values() and "GITHUB_TOKEN" not in seen and seen.get("ONLY") == "this"
    empty = SubprocessLauncher().start(LaunchSpec(name="e", argv=(sys.executable, "-c", dump, str(tmp_path / "e")),
                                                  status_pipe=False))
    empty._popen.wait(60)
    assert "GITHUB_TOKEN" not in json.loads((tmp_path / "e").read_text())  # an empty env is empty, not "inherit"
    child = spawn_child([sys.executable, "-c", dump, str(tmp_path / "b")])
    child.wait(60)
    seen = json.loads((tmp_path / "b").read_text())
    assert "SIE_SASL_PASSWORD" not in seen and "GITHUB_TOKEN" not in seen and seen.get("PATH") == os.environ["PATH"]
