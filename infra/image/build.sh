#!/usr/bin/env bash
# Build SIE's container image on this machine, pulling no base image from any registry. Two flavours:
#
#   cpu   (default) Debian trixie, CPython 3.13, torch = Debian's python3-torch (a CPU build): ~1 GB, the one
#         the one-node cluster (scripts/k8s_node.sh) and CI run
#   cuda  Debian bookworm, CPython 3.11, torch + its nvidia-* wheels from PyPI: ~5.5 GB, for GPU nodes
#
#   stage 1 (wheels):  every dependency as a BINARY wheel (pip --only-binary=:all:: nothing is compiled),
#                      exactly the versions and sha256 of infra/image/requirements-<flavour>.lock
#                      (`pip download/install --require-hashes`: a wheel whose hash differs stops the build),
#                      + SIE's wheel from this checkout (installed --no-deps)
#   stage 2 (runtime): a minimal Debian rootfs from Debian's own packages (mmdebstrap --variant minbase:
#                      python3 + ca-certificates [+ python3-torch, version pinned]; apt checks every .deb
#                      against the signed release), the wheels in /opt/sie/site-packages, user 10001,
#                      /usr/local/bin/sie
#   assembly:          umoci (OCI layout, three layers: debian, python deps, sie), skopeo -> a docker-archive
#                      tarball (`ctr -n k8s.io images import`, `docker load`, `podman load`, `kind load ...`)
#
#   infra/image/build.sh [--flavour cpu|cuda] [--tag TAG] [OUT_DIR]   default OUT_DIR: ~/.cache/sie/image
#   -> OUT_DIR/oci (OCI image layout, tag TAG, default the version), OUT_DIR/sie-TAG.docker.tar (sie:TAG),
#      OUT_DIR/rootfs (the unpacked runtime, for infra/image/smoke.sh), OUT_DIR/size.txt
#
# Cached in OUT_DIR/work: the wheels, the Debian rootfs and the two base layers, each keyed by what made it
# (suite + packages, the lock file's hash), so a rebuild for a new commit only adds SIE's layer (~1-2 min).
# Needs root (mmdebstrap's chroot, umoci unpack), mmdebstrap, umoci, skopeo (Debian packages), network to
# Debian's mirror and PyPI (first build only).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
python="${PYTHON:-python3}"
flavour=cpu
tag=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --flavour) flavour="$2"; shift 2 ;;
    --tag) tag="$2"; shift 2 ;;
    -*) echo "build.sh: unknown option $1" >&2; exit 2 ;;
    *) break ;;
  esac
done
out="${1:-$HOME/.cache/sie/image}"
case "$flavour" in
  # python3-torch: Debian's CPU build of PyTorch, pinned (a Debian update makes the build fail, not drift)
  cpu) suite=trixie; pyver=3.13; glibc=41; debs="python3,ca-certificates,tzdata,python3-torch=${SIE_IMAGE_DEBIAN_TORCH:-2.6.0+dfsg-7}" ;;
  cuda) suite=bookworm; pyver=3.11; glibc=36; debs="python3,ca-certificates,tzdata" ;;
  *) echo "build.sh: --flavour cpu|cuda" >&2; exit 2 ;;
esac
lock="$here/requirements-$flavour.lock"
[[ -f "$lock" ]] || { echo "build.sh: no $lock: python3 infra/image/lock.py $flavour" >&2; exit 3; }
# every manylinux tag the suite's glibc runs (pip matches --platform exactly); infra/image/lock.py lists the same
platforms=()
for v in $(seq "$glibc" -1 17); do platforms+=(--platform "manylinux_2_${v}_x86_64"); done
platforms+=(--platform manylinux2014_x86_64 --platform linux_x86_64)
for tool in mmdebstrap umoci skopeo; do
  command -v "$tool" >/dev/null || { echo "build.sh: $tool is missing: apt-get install mmdebstrap umoci skopeo" >&2; exit 3; }
done
version="$("$python" -c 'import tomllib,sys; print(tomllib.load(open(sys.argv[1],"rb"))["project"]["version"])' "$repo/pyproject.toml")"
tag="${tag:-$version}"
work="${SIE_IMAGE_WORK:-$out/work}"   # the caches (several output dirs may share one)
mkdir -p "$work/wheels-$flavour"
# one build at a time per cache dir (two share its src/, site/ and bundle/ scratch dirs)
exec 9>"$work/.lock"
flock 9
t0=$(date +%s)

echo "== stage 1: wheels (binary only, hash-checked against $(basename "$lock"))" >&2
rm -rf "$work/sie-wheel" && mkdir -p "$work/sie-wheel"
# a clean copy of the tracked files: no .venv, caches or build dirs leak into the wheel
git -C "$repo" ls-files -z | (cd "$repo" && tar --null -T - -cf -) | (rm -rf "$work/src" && mkdir -p "$work/src" && tar -xf - -C "$work/src")
"$python" -m pip wheel -q --no-deps --no-build-isolation -w "$work/sie-wheel" "$work/src"
wheel="$(ls "$work/sie-wheel"/sie-"$version"-*.whl)"
pip_target=(--only-binary=:all: "${platforms[@]}" --python-version "$pyver" --implementation cp)
# offline when every locked wheel is already here (a rebuild); else from PyPI. Either way hash-checked.
if ! "$python" -m pip download -q --require-hashes --no-deps --no-index --find-links "$work/wheels-$flavour" \
     "${pip_target[@]}" -d "$work/wheels-$flavour" -r "$lock" >/dev/null 2>&1; then
  "$python" -m pip download -q --require-hashes --no-deps "${pip_target[@]}" -d "$work/wheels-$flavour" -r "$lock"
fi

echo "== stage 2: runtime rootfs (Debian $suite, minbase + $debs)" >&2
rootfs_key="$(echo "$suite $debs v2" | sha256sum | cut -c1-16)"
if [[ ! -f "$work/rootfs-$rootfs_key.tar" ]]; then
  rm -rf "$work"/rootfs-*.tar
  mmdebstrap --quiet --variant=minbase --include="$debs" --aptopt='APT::Install-Recommends "false"' \
    --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
    --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-include=/usr/share/doc/*/copyright' \
    --customize-hook='chroot "$1" dpkg-query -W -f "\${Package}=\${Version}\n" > "$1"/opt/debian-packages.txt' \
    --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/* "$1"/var/log/*' \
    --customize-hook='echo "sie:x:10001:10001:SIE:/var/cache/sie:/usr/sbin/nologin" >> "$1"/etc/passwd' \
    --customize-hook='echo "sie:x:10001:" >> "$1"/etc/group' \
    --customize-hook='mkdir -p "$1"/var/cache/sie "$1"/var/lib/sie/agent "$1"/opt/sie/site-packages && chown 10001:10001 "$1"/var/cache/sie "$1"/var/lib/sie/agent' \
    --format=tar "$suite" "$work/rootfs-$rootfs_key.tmp.tar" http://deb.debian.org/debian
  mv "$work/rootfs-$rootfs_key.tmp.tar" "$work/rootfs-$rootfs_key.tar"
fi
rm -rf "$work/site" "$work/sie-site"
# --ignore-requires-python: pip 23's `install --target` checks Requires-Python against the interpreter running
# pip, not --python-version (numpy: "3.11.7 not in >=3.12"); the wheels' cpXY tags still pin the image's Python
"$python" -m pip install -q --no-index --find-links "$work/wheels-$flavour" --require-hashes --no-deps \
  --ignore-requires-python "${pip_target[@]}" --target "$work/site" -r "$lock"
"$python" -m pip install -q --no-index --no-deps "${pip_target[@]}" --target "$work/sie-site" "$wheel"
rm -rf "$work/site/bin" "$work/sie-site/bin"  # console scripts with this machine's #!; /usr/local/bin/sie below
find "$work/site" "$work/sie-site" -name __pycache__ -prune -exec rm -rf {} +

echo "== assembly: OCI layout with umoci" >&2
# the two base layers (Debian, the locked dependencies) are reused while their inputs are unchanged
base_key="$rootfs_key-$(sha256sum "$lock" | cut -c1-16)"
base="$work/base-$flavour"
rm -rf "$work/bundle"
if [[ "$(cat "$base/key" 2>/dev/null)" != "$base_key" ]]; then
  rm -rf "$base" && mkdir -p "$base"
  umoci init --layout "$base/oci"
  umoci new --image "$base/oci:base"
  umoci unpack --image "$base/oci:base" "$work/bundle" >/dev/null
  tar -xf "$work/rootfs-$rootfs_key.tar" -C "$work/bundle/rootfs"
  umoci repack --refresh-bundle --history.created_by "mmdebstrap --variant=minbase $suite +$debs" \
    --image "$base/oci:base" "$work/bundle"
  cp -a "$work/site/." "$work/bundle/rootfs/opt/sie/site-packages/"
  # byte-compiled at build time, by the image's own python: the root filesystem is read-only at run time
  chroot "$work/bundle/rootfs" /usr/bin/python3 -m compileall -q /opt/sie/site-packages >/dev/null || true
  umoci repack --refresh-bundle --history.created_by "pip install --require-hashes -r $(basename "$lock")" \
    --image "$base/oci:base" "$work/bundle"
  rm -rf "$work/bundle"
  echo "$base_key" >"$base/key"
fi
rm -rf "$out/oci" && cp -a "$base/oci" "$out/oci"
umoci unpack --image "$out/oci:base" "$work/bundle" >/dev/null
cp -a "$work/sie-site/." "$work/bundle/rootfs/opt/sie/site-packages/"
cat > "$work/bundle/rootfs/usr/local/bin/sie" <<'PY'
#!/usr/bin/python3
import sys
from sie.cli import main
sys.exit(main())
PY
chmod 0755 "$work/bundle/rootfs/usr/local/bin/sie"
chroot "$work/bundle/rootfs" /usr/bin/python3 -m compileall -q /opt/sie/site-packages/sie >/dev/null
umoci repack --refresh-bundle --history.created_by "SIE $version" --image "$out/oci:base" "$work/bundle"
umoci config --image "$out/oci:base" --tag "$tag" \
  --config.user 10001:10001 --config.workingdir /var/cache/sie \
  --config.entrypoint /usr/local/bin/sie --config.cmd --help \
  --config.env PATH=/usr/local/bin:/usr/bin:/bin --config.env PYTHONPATH=/opt/sie/site-packages \
  --config.env PYTHONDONTWRITEBYTECODE=1 --config.env SIE_CACHE_DIR=/var/cache/sie \
  --config.label org.opencontainers.image.title=sie --config.label "org.opencontainers.image.version=$version" \
  --config.label "org.opencontainers.image.revision=$(git -C "$repo" rev-parse HEAD)" \
  --config.label "org.opencontainers.image.flavour=$flavour"
umoci tag --image "$out/oci:$tag" base >/dev/null 2>&1 || true
umoci rm --image "$out/oci:base"
umoci gc --layout "$out/oci"
rm -rf "$out/rootfs" && mv "$work/bundle/rootfs" "$out/rootfs" && rm -rf "$work/bundle"
rm -f "$out"/sie-*.docker.tar
skopeo copy --quiet "oci:$out/oci:$tag" "docker-archive:$out/sie-$tag.docker.tar:sie:$tag"

uncompressed=$(du -sb "$out/rootfs" | cut -f1)
compressed=$(du -cb "$out/oci/blobs/sha256"/* | tail -1 | cut -f1)
compilers=$(ls "$out/rootfs/usr/bin" | grep -E '^(gcc|cc|g\+\+|c\+\+|clang|ld|as|make)(-[0-9.]+)?$' || true)
{
  echo "SIE image $version ($flavour, tag $tag) built $(date -u +%Y-%m-%dT%H:%M:%SZ) in $(( $(date +%s) - t0 )) s by infra/image/build.sh"
  echo "  base: Debian $suite (mmdebstrap minbase + $debs), no image pulled"
  echo "  Python dependencies: $(grep -c '^[a-z0-9]' "$lock") wheels, sha256-pinned in $(basename "$lock")"
  echo "  torch: $(grep -E '^(python3-torch|libtorch[0-9.]*)=' "$out/rootfs/opt/debian-packages.txt" 2>/dev/null | tr '\n' ' ')$(grep -E '^torch==' "$lock" | cut -d' ' -f1)"
  echo "  uncompressed root filesystem: $(( uncompressed / 1048576 )) MiB"
  echo "  OCI blobs (gzip layers + config): $(( compressed / 1048576 )) MiB"
  echo "  largest in /opt/sie/site-packages:"
  du -sm "$out/rootfs/opt/sie/site-packages"/* | sort -rn | sed -n '1,6s/^/    /p'
  echo "  largest in /usr/lib:"
  du -sm "$out/rootfs/usr/lib"/* "$out/rootfs/usr/lib/x86_64-linux-gnu"/* 2>/dev/null | sort -rn | sed -n '1,6s/^/    /p'
  echo "  compilers in the runtime: ${compilers:-none}"
} | tee "$out/size.txt"
echo "$out"
