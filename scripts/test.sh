#!/usr/bin/env bash
# Run SIE's test suite against a real Kafka broker. Uses the broker named by
# SIE_BOOTSTRAP_SERVERS when set; otherwise the test session starts its own on
# free loopback ports (and the 3-broker fault tests start a cluster of three).
#
#   ./scripts/test.sh            the full suite (what CI runs)
#   ./scripts/test.sh --quick    the quick tier: every test that needs no broker, no Kubernetes tools and no
#                                real LLM server, plus the smoke tests on one broker (tests/conftest.py SMOKE)
# Both run in parallel (pytest-xdist): SIE_TEST_WORKERS workers (default 4: most tests wait on Kafka, not the CPU,
# so 4 keep 2 cores busy; 5 took longer, 11:57 against 11:24-11:43 for the parallel phase, though 4 left the cores
# 21 % idle); tests with brokers or servers of their own run in groups, one worker each
# (tests/conftest.py GROUP_FILES). The full suite then runs the real vLLM servers' tests (real_llm) on their own:
# each is CPU-bound for minutes, and beside four busy workers they missed their deadlines (and once memory).
# With arguments, the full run is one parallel pytest over them. `-n 0` runs in this process (a debugger, -x).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
parallel=(-n "${SIE_TEST_WORKERS:-4}" --dist loadgroup)
if [ "${1:-}" = "--quick" ]; then
  shift
  exec "$PY" -m pytest -q -ra "${parallel[@]}" -m "smoke or not (kafka or k8s or real_llm or packaging or fault_campaign)" "$@"
fi
if [ $# -gt 0 ]; then
  exec "$PY" -m pytest -q -ra --durations=30 "${parallel[@]}" "$@"
fi
status=0
"$PY" -m pytest -q -ra --durations=30 "${parallel[@]}" -m "not real_llm" || status=$?
echo "=== the real vLLM servers' tests, on their own (real_llm) ==="
"$PY" -m pytest -q -ra --durations=10 -n 0 -m real_llm || status=$?
exit "$status"
