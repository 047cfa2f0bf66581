"""``--metrics-port 0`` means "any free port" everywhere (issue 28.6): ``sie agent`` accepted it while ``sie
score`` refused it (``not in the range 1<=x<=65535``).  The real CLI, as a child process: its ready line
prints the port it bound, and that port answers /metrics."""

from __future__ import annotations

import os
import re
import sys
import uuid
from pathlib import Path

import httpx
import pytest
import yaml

from sie.cli import main
from tests.support.cdc_support import ORDER_MAPPING
from tests.support.helpers import create_topic, wait_until
from tests.support.scorer_fixtures import ALLOWED_MODULES, LoggedProcess, write_echo_spec

pytestmark = pytest.mark.kafka


def _cdc_connector(settings, tmp_path: Path) -> Path:
    u = uuid.uuid4().hex[:10]
    path = tmp_path / "connector.yaml"
    path.write_text(yaml.safe_dump({"kind": "CdcConnector", "metadata": {"name": f"cdc-mp-{u}"},
                                    "spec": {"format": "canal-json", "model": "orders-model", "tables": ["shop.*"],
                                             "sourceTopic": create_topic(settings, f"test.cdc.src.{u}", 1),
                                             "mapping": dict(ORDER_MAPPING),
                                             "requestTopic": create_topic(settings, f"test.cdc.req.{u}", 1)}}))
    return path


@pytest.mark.parametrize("command", ["score", "cdc"])
def test_metrics_port_0_binds_a_free_port_and_the_ready_line_names_it(kafka_settings, tmp_path, command):
    if command == "score":
        args = ["score", "-f", str(write_echo_spec(tmp_path)), "--instance", "mp0", "--partitions", "1",
                "--log-level", "warning", "--metrics-port", "0"]
        family = "sie_model_"
    else:
        args = ["cdc", "run", "-f", str(_cdc_connector(kafka_settings, tmp_path)), "--instance", "mp0",
                "--partitions", "1", "--log-level", "warning", "--metrics-port", "0"]
        family = "sie_cdc_"
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "SIE_ALLOWED_MODULES": ",".join(ALLOWED_MODULES)}
    proc = LoggedProcess([sys.executable, "-m", "sie", "--bootstrap-servers", kafka_settings.bootstrap_servers,
                          *args], tmp_path / f"{command}.log", env)
    try:
        wait_until(lambda: "ready:" in proc.output() or proc.proc.poll() is not None, 90,
                   message=lambda: f"the ready line of sie {command}: {proc.output()[-2000:]}")
        found = re.search(r"metrics on 127\.0\.0\.1:(\d+)$", proc.output(), re.M)
        assert found, proc.output()[-2000:]
        port = int(found.group(1))
        assert port > 0
        body = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
        assert family in body
    finally:
        code = proc.terminate() if proc.proc.poll() is None else proc.proc.returncode
    assert code == 0, proc.output()[-2000:]


@pytest.mark.parametrize("command", [["score", "-f", "{spec}"], ["cdc", "run", "-f", "{spec}"], ["agent", "--node", "n"]])
def test_every_metrics_port_option_takes_0_and_refuses_what_no_port_is(command, tmp_path, capsys):
    spec = tmp_path / "x.yaml"
    spec.write_text("{}")
    command = [part.format(spec=spec) for part in command]
    assert main([*command, "--metrics-port", "-1"]) == 2
    assert "--metrics-port" in capsys.readouterr().err
    assert main([*command, "--metrics-port", "0", "--help"]) == 0  # accepted: parsing gets as far as --help
    assert "(0 = any free port" in " ".join(capsys.readouterr().out.split())
