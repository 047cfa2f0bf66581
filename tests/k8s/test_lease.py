"""Lease leader election (k8s/lease.py) against the real API server, time injected."""

from __future__ import annotations

import uuid

import pytest

from sie.k8s.lease import LeaseElector
from tests.k8s.kube_env import KubeApiServer


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def coordination(kube: KubeApiServer):
    from kubernetes import client, config

    api = config.new_client_from_config(config_file=str(kube.kubeconfig))
    yield client.CoordinationV1Api(api)
    api.close()


def test_one_candidate_leads_the_other_takes_over_only_after_the_lease_expires_by_its_own_clock(coordination):
    name = f"lease-{uuid.uuid4().hex[:6]}"
    a_clock, b_clock = Clock(), Clock()
    a = LeaseElector(coordination, "default", name, "a", clock=a_clock)
    b = LeaseElector(coordination, "default", name, "b", clock=b_clock)
    assert a.step() is True
    assert b.step() is False and b.holder == "a"
    a_clock.now += 5
    assert a.step() is True  # renewed: the record changes, so b's clock for it restarts
    b_clock.now += 14
    assert b.step() is False
    b_clock.now += 14  # a silent for 14 s by b's clock since b saw its renewal: still < 15 s
    assert b.step() is False
    b_clock.now += 2  # 16 s without a change: expired
    assert b.step() is True
    assert coordination.read_namespaced_lease(name, "default").spec.holder_identity == "b"
    a_clock.now += 11  # a could not renew for renew_deadline_s: it stops acting by itself
    assert a.leading is False
    assert a.step() is False  # and cannot take it back while b renews


def test_release_hands_over_at_once(coordination):
    name = f"lease-{uuid.uuid4().hex[:6]}"
    a = LeaseElector(coordination, "default", name, "a", clock=Clock())
    b = LeaseElector(coordination, "default", name, "b", clock=Clock())
    assert a.step() and not b.step()
    a.release()
    assert a.leading is False
    assert b.step() is True
    lease = coordination.read_namespaced_lease(name, "default")
    assert lease.spec.holder_identity == "b" and lease.spec.lease_transitions == 1


def test_a_write_on_a_stale_resource_version_loses(coordination):
    """Two candidates that both saw the Lease expire: the API server takes the first write only."""
    name = f"lease-{uuid.uuid4().hex[:6]}"
    clocks = {n: Clock() for n in "abc"}
    a, b, c = (LeaseElector(coordination, "default", name, n, clock=clocks[n]) for n in "abc")
    assert a.step()
    assert not b.step() and not c.step()
    for n in "bc":
        clocks[n].now += 20
    real_replace = coordination.replace_namespaced_lease
    raced = []

    def replace_after_c(name_, ns, body):  # b's write lands after c has written on the same version
        if not raced:
            raced.append(True)
            assert c.step() is True
        return real_replace(name_, ns, body)

    coordination.replace_namespaced_lease = replace_after_c
    try:
        assert b.step() is False
    finally:
        coordination.replace_namespaced_lease = real_replace
    assert coordination.read_namespaced_lease(name, "default").spec.holder_identity == "c"
