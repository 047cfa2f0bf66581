#!/usr/bin/env bash
# Quick start, step 1 of 2: set everything up on a fresh machine and run the demo
# on a local Kafka broker (127.0.0.1:9092). Step 2 is ./scripts/test.sh.
set -euo pipefail
cd "$(dirname "$0")"
./scripts/setup.sh
exec "${PYTHON:-python3}" -m sie demo "$@"
