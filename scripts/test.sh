#!/usr/bin/env bash
# Run SIE's test suite against a real Kafka broker. Uses the broker named by
# SIE_BOOTSTRAP_SERVERS when set; otherwise the test session starts its own on
# free loopback ports (and the 3-broker fault tests start a cluster of three).
#
#   ./scripts/test.sh            the full suite (what CI runs)
#   ./scripts/test.sh --quick    the quick tier: every test that needs no broker, no Kubernetes tools and no
#                                real LLM server, plus the smoke tests on one broker (tests/conftest.py SMOKE)
# Further arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = "--quick" ]; then
  shift
  exec "${PYTHON:-python3}" -m pytest -q -ra -m "smoke or not (kafka or k8s or real_llm or slow or fault_campaign)" "$@"
fi
exec "${PYTHON:-python3}" -m pytest -q -ra "$@"
