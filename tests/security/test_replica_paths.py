"""Hole 3: an assignment's ``replica_id`` was a folder name as-is: an absolute or ``../..`` id made the agent create
folders, write ``spec-*.json`` and ``worker.log`` and start a worker anywhere.  Now the naming module checks it
(``sie.kernel.names.check_replica_id``) and the folder is proved to be a child of the work directory; a refused id
is a FAILED replica with the reason, nothing on disk, no process, no crash loop.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sie.kernel.errors import ConfigError
from sie.kernel.names import check_replica_id
from sie.schemas.spec import load
from sie.workers.agent.launch import WorkerCommandBuilder
from sie.workers.process import LaunchRefused
from sie.workers.replica import DesiredReplica
from sie.workers.supervisor import Supervisor, SupervisorPolicy
from tests.fakes.workers import FakeClock, FakeLauncher

SPEC = load({"name": "ok", "version": "1", "backend": {"type": "python", "callable": "models.fraud.rules:score"}})
HOSTILE = ["../../escaped", "/tmp/sie-absolute-escape", "a/../../b", ".hidden", "..", "a/b", "x\ny", "", "c" * 201,
           "back\\slash"]


@pytest.mark.parametrize("replica_id", HOSTILE)
def test_a_replica_id_that_is_no_plain_folder_name_is_refused_by_name(tmp_path: Path, replica_id: str):
    work = tmp_path / "nested" / "work"
    builder = WorkerCommandBuilder(work, base_env={})
    with pytest.raises(LaunchRefused, match=r"replica refused: assignment replica_id: must match .* \(a folder name"):
        builder(DesiredReplica(replica_id, "ok", "1", json.dumps(SPEC.to_document())))
    assert not any(tmp_path.rglob("*.json")) and not any(tmp_path.rglob("worker.log"))
    assert not Path("/tmp/sie-absolute-escape").exists()


def test_plain_ids_of_models_and_connectors_stay_inside_the_work_directory(tmp_path: Path):
    builder = WorkerCommandBuilder(tmp_path, base_env={})
    for replica_id in ("fraud-rules-0", "fraud.v2-3", "cdc:orders-0"):
        assert check_replica_id(replica_id) == replica_id
        assert builder.replica_dir(replica_id).parent == tmp_path.resolve()
    with pytest.raises(ConfigError, match=r"got '\\x1b\[31mred'"):  # shown escaped: no raw control byte in a log
        check_replica_id("\x1b[31mred")


def test_the_supervisor_reports_a_refused_replica_failed_with_the_reason_and_launches_only_the_good_one(tmp_path: Path):
    builder = WorkerCommandBuilder(tmp_path / "work", base_env={})
    launcher, clock = FakeLauncher(), FakeClock()
    sup = Supervisor(launcher, builder, clock, SupervisorPolicy(immediate_first_restart=True))
    doc = json.dumps(SPEC.to_document())
    sup.set_desired([DesiredReplica("../../../etc/cron.d/x", "ok", "1", doc), DesiredReplica("ok-0", "ok", "1", doc)])
    changes = sup.update() + sup.update()
    evil = [c for c in changes if c.replica_id.startswith("../")]
    assert [c.state.value for c in evil][-1] == "FAILED"
    assert evil[-1].reason.startswith("replica refused: assignment replica_id: must match")
    assert [h.spec.name for h in launcher.started] == ["ok-0"]
