#!/usr/bin/env bash
# Set up SIE on this machine: check prerequisites, install the Python package
# and its dependencies (torch is a large download: pip skips it when present),
# and fetch Apache Kafka from Maven Central once per machine.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
step() { printf '\n==> %s\n' "$*"; }
die() { printf 'error: %s\n' "$*" >&2; exit 1; }

step "checking prerequisites"
command -v "$PY" >/dev/null || die "python3 not found: install Python 3.11+"
"$PY" - <<'PYEOF' || die "Python 3.11+ is required (found $($PY -V 2>&1)); install it or set PYTHON=/path/to/python3.11"
import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)
PYEOF
command -v java >/dev/null || die "java not found: Kafka needs Java 17+ (Debian/Ubuntu: apt-get install openjdk-17-jre-headless)"
jv=$(java -version 2>&1 | head -1 | sed -E 's/.*version "([0-9]+).*/\1/')
[ "${jv:-0}" -ge 17 ] 2>/dev/null || die "Java 17+ is required (found: $(java -version 2>&1 | head -1)); apt-get install openjdk-17-jre-headless"
command -v mvn >/dev/null || die "mvn not found: Kafka's jars are fetched with Maven (apt-get install maven)"
echo "python $($PY -V 2>&1 | cut -d' ' -f2), java $jv, $(mvn -v 2>/dev/null | head -1)"

step "installing the sie package and its dependencies (first run downloads torch: several minutes)"
"$PY" -m pip install --disable-pip-version-check --progress-bar off -e ".[test,bench]" 2>&1 \
  | grep -vE '^(Requirement already satisfied|  Using cached|WARNING: Running pip as)' || true
"$PY" -c "import confluent_kafka, torch, pydantic, fastavro, prometheus_client" \
  || die "dependencies did not install: see pip's output above"

step "fetching Apache Kafka from Maven Central (once per machine)"
"$PY" -m sie kafka fetch

echo
echo "setup done."
