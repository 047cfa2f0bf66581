#!/usr/bin/env bash
# Set up SIE on this machine: check prerequisites, install the Python package
# and its dependencies (torch is a large download: pip skips it when present),
# fetch Apache Kafka from Maven Central once per machine, and install Prometheus
# and Chromium (Debian packages) for the observability tests where apt-get can.
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

# Optional: the observability tests need `prometheus`/`promtool` and `chromium`, the network-partition tests
# (tests/support/netns.py, as root) `nft`; without them they skip, saying so. Installed from Debian's packages when this
# runs as root with apt-get (CI does).
step "installing Prometheus and Chromium (observability tests) and nftables (partition tests) (optional)"
if command -v promtool >/dev/null && command -v prometheus >/dev/null && command -v chromium >/dev/null \
   && command -v nft >/dev/null; then
  echo "prometheus, chromium and nft already installed"
elif command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
  apt_install() { DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends prometheus chromium nftables; }
  if apt_install >/tmp/sie-apt.log 2>&1 || { apt-get update -q >>/tmp/sie-apt.log 2>&1 && apt_install >>/tmp/sie-apt.log 2>&1; }; then
    echo "installed: $(prometheus --version 2>&1 | head -1); $(chromium --version 2>/dev/null | head -1); $(nft --version 2>&1)"
  else
    echo "warning: apt-get could not install prometheus/chromium/nftables (see /tmp/sie-apt.log): their tests will skip"
  fi
else
  echo "note: prometheus/chromium/nft not installed and apt-get is not usable here (not root?): their tests will skip;"
  echo "      Debian/Ubuntu: sudo apt-get install prometheus chromium nftables"
fi

# Optional: the one-node cluster of the in-cluster tests (scripts/k8s_node.sh, tests/k8s/test_pods.py) runs
# Debian's containerd, runc and CNI plugins, and builds SIE's image with mmdebstrap, umoci and skopeo.
step "installing containerd, runc, CNI plugins, mmdebstrap, umoci, skopeo (in-cluster tests) (optional)"
node_pkgs="containerd runc containernetworking-plugins mmdebstrap umoci skopeo"
if command -v containerd >/dev/null && command -v runc >/dev/null && [ -x /usr/lib/cni/bridge ] \
   && command -v mmdebstrap >/dev/null && command -v umoci >/dev/null && command -v skopeo >/dev/null; then
  echo "containerd, runc, CNI plugins, mmdebstrap, umoci and skopeo already installed"
elif command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
  # shellcheck disable=SC2086
  node_install() { DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $node_pkgs; }
  if node_install >>/tmp/sie-apt.log 2>&1 || { apt-get update -q >>/tmp/sie-apt.log 2>&1 && node_install >>/tmp/sie-apt.log 2>&1; }; then
    echo "installed: $(containerd --version 2>&1 | head -1); $(runc --version 2>&1 | head -1)"
  else
    echo "warning: apt-get could not install $node_pkgs (see /tmp/sie-apt.log): the in-cluster tests will skip"
  fi
else
  echo "note: $node_pkgs not installed and apt-get is not usable here: the in-cluster tests will skip"
fi

echo
echo "setup done."
