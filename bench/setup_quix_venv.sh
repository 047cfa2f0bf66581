#!/usr/bin/env bash
# The Quix Streams contestant of bench/bench_scoring.py and bench/bench_latency.py runs in its own virtualenv:
# quixstreams 3.x pins confluent-kafka < 2.13, while SIE is measured on its own (newer) confluent-kafka, so the
# two cannot share one environment without changing the client SIE is measured with.
#
#   bash bench/setup_quix_venv.sh [VENV_DIR]      # default bench/.venv-quix (git-ignored)
#
# The virtualenv sees the system site-packages (torch), gets quixstreams (the `bench-quix` extra of
# pyproject.toml) and this checkout installed editable WITHOUT dependencies (only for the spec loader, the
# compiled validator and the model backend the Quix role uses: the same as the SIE scorer's).  The benches
# find it there, or through --quix-python / $SIE_BENCH_QUIX_PYTHON.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
VENV="${1:-$ROOT/bench/.venv-quix}"
PYTHON="${PYTHON:-python3}"
"$PYTHON" -m venv --system-site-packages "$VENV"
"$VENV/bin/pip" install -q "quixstreams==3.28.1"
"$VENV/bin/pip" install -q --no-deps -e "$ROOT"
"$VENV/bin/python" -c "import quixstreams, confluent_kafka, sie.schemas.validation; \
print('quixstreams', quixstreams.__version__, 'confluent-kafka', confluent_kafka.version())"
echo "ready: $VENV/bin/python"
