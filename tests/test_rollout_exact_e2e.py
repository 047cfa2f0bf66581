"""Every key answered by exactly the version its epoch's weight gives it, through slow loads and worker kills
(issue 34): `sie control` + two `sie agent` processes, each version's code uploaded by `sie apply` from a folder
of its own (``tests/support/user_models.py``: outputs that name the code that answered), a keyed request stream
(keys repeat, so a key's answers over time can be compared).

Both versions take ``LOAD_S`` (>= 10 s) to load, as a worker and as a companion process.  So in ``Surging`` the
surge replica (its own version is the canary) waits that long for its stable companion, a stable worker
SIGKILLed mid-canary comes back, loads its own version, then waits that long for its canary companion, and a
stable replica whose canary companion is SIGKILLed mid-canary serves nothing until it is loaded again.  A stable
worker is also SIGKILLed in Surging and a worker mid-way through Draining (each phase of a rollout has a kill).
Before, both answered meanwhile with the version they had (``sie.routing.fallback``): the canary answered at
weight 0, and keys the canary had answered went back to stable.

The proof over every committed result (read_committed): every request exactly once; each result's ``version``
is the code that produced it, and is what its key's bucket gives at the weight of the epoch stamped on it
(``sie.routing.epoch``); no result carries a fallback; a key once answered by the canary is never answered by
the stable version again (no rollback in these runs): ``tests/support/rollout_checks.check_answers``, the rules
``bench/rollout_campaign.py`` checks over many rollouts.
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from sie.schemas.spec import load
from tests.support.cluster_harness import Cluster, RequestStream, try_get, wait_for
from tests.support.rollout_checks import check_answers, rollout_epochs
from tests.support.scorer_fixtures import prove_exactly_once
from tests.support.user_models import ALLOWED_MODULES, python_project

pytestmark = pytest.mark.kafka

LOAD_S = 10.0
INPUTS = {"tenure": 120.0, "spend": 40.0, "tickets": 1.0}
GATES = {"minSamples": 10, "p99MaxMs": 60_000, "p99SlackMs": 30_000, "p99MaxRatio": 100}


def _cluster(kafka_settings: Any, tmp_path: Path) -> Cluster:
    c = Cluster(kafka_settings, tmp_path / "cluster", extra_env={
        "SIE_ALLOWED_MODULES": ALLOWED_MODULES, "SIE_COMPANION_CALL_TIMEOUT_S": "5"})
    c.start_control("cp-1")
    for i in range(2):  # separate caches: each agent fetches what `sie apply` uploaded
        c.start_agent(f"node-{'ab'[i]}", gpus=None, env={"SIE_CACHE_DIR": str(tmp_path / f"cache-{i}")})
    c.wait_leader(60)
    return c


def _apply(c: Cluster, spec_file: Path) -> None:
    done = c.sie("apply", "--control-url", f"http://127.0.0.1:{c.api()}", "-f", str(spec_file), timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


def _rollout(c: Cluster, model: str) -> dict[str, Any] | None:
    return try_get(c.api(), f"/v1/rollouts/{model}")


def _companion_pid(replica: str, version: str) -> int | None:
    """The pid of replica ``replica``'s companion process for ``version`` (``sie.workers.version_host``)."""
    label = f"replica {replica} version {version}"
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"sie.workers.version_host" in argv and label.encode() in argv:
            return int(entry.name)
    return None


def _kill_worker(c: Cluster, replica: str) -> None:
    """SIGKILL ``replica``'s worker; its agent restarts it (same replica id)."""
    workers = {rid: pid for rid, (_n, pid) in c.all_workers().items()}
    assert replica in workers, workers
    os.kill(workers[replica], signal.SIGKILL)
    killed_at = time.monotonic()
    wait_for(lambda: (p := c.all_workers().get(replica)) and p[1] != workers[replica], 60,
             lambda: f"{replica} restarted: {c.all_workers()}")
    print(f"{replica} restarted {time.monotonic() - killed_at:.1f}s after its SIGKILL "
          f"({(_rollout(c, replica.rsplit('-', 1)[0]) or {}).get('phase')})")


def test_slow_companions_and_worker_kills_in_every_phase_answer_nothing_off_their_weight(
        kafka_settings, tmp_path):
    src = tmp_path / "src"
    c = _cluster(kafka_settings, tmp_path)
    stream = None
    try:
        v1 = python_project(src, "1.0.0", replicas=2, load_s=LOAD_S)
        _apply(c, v1)
        c.wait_ready("churn-py", 2, timeout=240)
        topics = c.spec_topics("churn-py")
        stream = RequestStream(c.settings, topics["requests"], INPUTS, f"x{uuid.uuid4().hex[:6]}", rate_per_s=25,
                               keys=200).start()
        rollout = {"steps": [50, 100], "intervalSeconds": 45, "surgeTimeoutSeconds": 300, "gates": GATES}
        _apply(c, python_project(src, "1.1.0", replicas=2, load_s=LOAD_S, rollout=rollout))

        # Surging lasts at least the surge replica's own load plus its stable companion's (each LOAD_S): SIGKILL
        # stable worker 1 in it; its restart serves stable's share only once its own version is loaded again
        wait_for(lambda: (r := _rollout(c, "churn-py")) and r["phase"] == "Surging", 120,
                 lambda: f"Surging: {_rollout(c, 'churn-py')}")
        _kill_worker(c, "churn-py-1")
        surging = wait_for(lambda: (r := _rollout(c, "churn-py")) and r["phase"] == "Canary" and r, 360,
                           lambda: f"Canary: {_rollout(c, 'churn-py')}\n{c.logs()}")
        print(f"Surging -> Canary: {[e['reason'] for e in surging['events'] if e['from'] == 'Surging']}")

        # mid-canary: SIGKILL the canary companion of stable replica 1: it leaves its group until the companion
        # is restarted and loaded again (LOAD_S), the replicas serving both versions take its partitions
        companion = _companion_pid("churn-py-1", "1.1.0")
        assert companion is not None, "churn-py-1 serves 1.1.0 from a companion process"
        os.kill(companion, signal.SIGKILL)
        # and SIGKILL stable worker 0; its agent restarts it, and the restart must not take partitions before its
        # canary companion is ready (LOAD_S after its own load)
        _kill_worker(c, "churn-py-0")
        wait_for(lambda: (p := _companion_pid("churn-py-1", "1.1.0")) and p != companion, 120,
                 lambda: f"churn-py-1's companion restarted\n{c.logs()}")

        # Draining: each replica is replaced by a 1.1.0 worker (LOAD_S each); SIGKILL a worker mid-way
        wait_for(lambda: (r := _rollout(c, "churn-py")) and r["phase"] in ("Draining", "Complete") and r, 360,
                 lambda: f"Draining: {_rollout(c, 'churn-py')}\n{c.logs()}")
        if (_rollout(c, "churn-py") or {}).get("phase") == "Draining":
            _kill_worker(c, "churn-py-1")

        final = wait_for(lambda: (r := _rollout(c, "churn-py")) and r["phase"] in ("Complete", "RolledBack", "Failed")
                         and r, 360, lambda: f"the rollout ends ({_rollout(c, 'churn-py')})\n{c.logs()}")
        assert final["phase"] == "Complete", final["events"]
        tag = stream.tag
        sent = stream.stop()
        stream = None
        spec = load(v1, topic_prefix=c.prefix)
        results, dead = prove_exactly_once(c.settings, spec, {f"{tag}-{n}" for n in range(sent)}, timeout=120)
        assert not dead, [d.headers() for d in dead[:3]]
        report = check_answers(results, dead, rollout_epochs(c.settings, "churn-py"), "1.0.0", "1.1.0")
        assert report.clean, f"{report.summary()}; first findings: {report.findings()}"
        counts = report.by_epoch
        print(f"{report.summary()}: {counts}")
        assert any(k.startswith("epoch 0 (0%") and k.endswith(" 1.0.0") for k in counts), \
            f"answers during Surging (epoch 0, weight 0): {counts}"
        assert any(k.endswith(" 1.1.0") for k in counts), counts
    finally:
        if stream is not None:
            stream.stop()
        c.close()
