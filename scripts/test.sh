#!/usr/bin/env bash
# Run SIE's test suite against a real Kafka broker. Uses the broker named by
# SIE_BOOTSTRAP_SERVERS when set; otherwise the test session starts its own on
# free loopback ports (and the 3-broker fault tests start a cluster of three).
set -euo pipefail
cd "$(dirname "$0")/.."
exec "${PYTHON:-python3}" -m pytest -q -ra "$@"
