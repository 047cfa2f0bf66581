#!/usr/bin/env bash
# Smoke-test the image built by infra/image/build.sh from its own filesystem, against the host's broker:
# podman is not installed here, so the unpacked root filesystem runs in a chroot, as user 10001, with the
# root filesystem READ-ONLY (a read-only bind mount; tmpfs on /tmp and /var/cache/sie, as the chart mounts
# emptyDirs) and the host's network (the broker on loopback).
#
#   infra/image/smoke.sh [OUT_DIR]        default OUT_DIR: ~/.cache/sie/image; SIE_BOOTSTRAP_SERVERS: the broker
#
# 1. `sie --version`
# 2. `sie topics ensure` + `sie score -f <the packaged fraud-scorer spec>` in the image, N requests produced
#    by the image's `sie produce`; the results are read back read_committed by the host and counted:
#    every request id exactly once, no dead letter. Prints the counts; exit 1 otherwise.
set -euo pipefail
out="${1:-$HOME/.cache/sie/image}"
rootfs="$out/rootfs"
bootstrap="${SIE_BOOTSTRAP_SERVERS:-127.0.0.1:9092}"
python="${PYTHON:-python3}"
n="${SMOKE_REQUESTS:-500}"
prefix="smoke$(date +%s)"
run="$(mktemp -d /tmp/sie-smoke.XXXXXX)"
[[ -x "$rootfs/usr/local/bin/sie" ]] || { echo "smoke.sh: no image root filesystem at $rootfs (run infra/image/build.sh)" >&2; exit 2; }

mnt="$run/root"
mkdir -p "$mnt"
cleanup() {
  [[ -n "${scorer:-}" ]] && kill -TERM "$scorer" 2>/dev/null && wait "$scorer" 2>/dev/null || true
  for m in var/cache/sie tmp dev proc; do umount "$mnt/$m" 2>/dev/null || umount -l "$mnt/$m" 2>/dev/null || true; done
  umount "$mnt" 2>/dev/null || umount -l "$mnt" 2>/dev/null || true
  rmdir "$mnt" "$run" 2>/dev/null || rm -rf --one-file-system "$run"
}
trap cleanup EXIT
mount --bind "$rootfs" "$mnt"
mount -o remount,bind,ro "$mnt"
mount -t proc proc "$mnt/proc"
mount --bind /dev "$mnt/dev"
mount -t tmpfs -o mode=1777 tmpfs "$mnt/tmp"
mount -t tmpfs -o uid=10001,gid=10001,mode=0700 tmpfs "$mnt/var/cache/sie"

in_image() {  # `exec`: run in the background, $! is the scorer itself (chroot execs env execs python)
  exec chroot --userspec=10001:10001 "$mnt" /usr/bin/env -i PATH=/usr/local/bin:/usr/bin:/bin \
    PYTHONPATH=/opt/sie/site-packages PYTHONDONTWRITEBYTECODE=1 SIE_CACHE_DIR=/var/cache/sie HOME=/var/cache/sie \
    SIE_BOOTSTRAP_SERVERS="$bootstrap" SIE_TOPIC_PREFIX="$prefix" /usr/local/bin/sie "$@"
}

echo "== sie --version (from the image)"
(in_image --version)
echo "== sie topics ensure + sie score (prefix $prefix, broker $bootstrap)"
(in_image topics ensure >/dev/null)
spec=/opt/sie/site-packages/sie/examples/fraud-scorer.yaml
in_image score -f "$spec" --instance smoke > "$run/score.log" 2>&1 &
scorer=$!
for _ in $(seq 1 240); do grep -q "^ready" "$run/score.log" && break; kill -0 "$scorer" || break; sleep 0.5; done
grep -q "^ready" "$run/score.log" || { echo "the scorer did not get ready:"; tail -20 "$run/score.log"; exit 1; }
"$python" - "$n" > "$mnt/tmp/requests.jsonl" <<'PY'
import json, random, sys
rng = random.Random(7)
for i in range(int(sys.argv[1])):
    print(json.dumps({"id": f"smoke-{i}", "inputs": {
        "amount": round(rng.uniform(1, 5000), 2), "merchant_risk": round(rng.random(), 3), "hour": rng.randrange(24),
        "account_age_days": rng.randrange(3000), "is_foreign": rng.random() < 0.2, "tx_count_24h": rng.randrange(40)}}))
PY
echo "== $n requests produced by the image's sie produce"
(in_image produce --spec "$spec" --file /tmp/requests.jsonl) | tail -1
echo "== results read back read_committed (host), counted by id"
"$python" - "$bootstrap" "$prefix" "$n" <<'PY'
import json, sys, time, uuid
from collections import Counter
from confluent_kafka import Consumer, TopicPartition
bootstrap, prefix, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
topic, dlq = f"{prefix}.model.fraud-scorer.results", f"{prefix}.model.fraud-scorer.dlq"
c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"smoke-{uuid.uuid4().hex}", "isolation.level": "read_committed",
              "auto.offset.reset": "earliest", "enable.auto.commit": False})
md = c.list_topics(timeout=10)
c.assign([TopicPartition(t, p, -2) for t in (topic, dlq) if t in md.topics for p in md.topics[t].partitions])
ids, dead, deadline = Counter(), 0, time.monotonic() + 120
while time.monotonic() < deadline and sum(ids.values()) + dead < n:
    msg = c.poll(0.5)
    if msg is None or msg.error():
        continue
    if msg.topic() == dlq:
        dead += 1
    else:
        ids[json.loads(msg.value())["id"]] += 1
end = time.monotonic() + 5  # then read on for 5 s: a duplicate written late must show up too
while time.monotonic() < end:
    msg = c.poll(0.2)
    if msg is not None and not msg.error():
        dead += msg.topic() == dlq
        if msg.topic() == topic:
            ids[json.loads(msg.value())["id"]] += 1
c.close()
twice = [i for i, k in ids.items() if k > 1]
missing = n - len(ids)
print(f"requests {n}, results {sum(ids.values())} for {len(ids)} ids, duplicates {len(twice)}, missing {missing}, "
      f"dead letters {dead}")
sys.exit(0 if not twice and not missing and not dead else 1)
PY
echo "== ok: scored exactly once from the image's filesystem (read-only root, user 10001)"
