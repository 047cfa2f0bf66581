#!/usr/bin/env bash
# Build SIE's container image on this machine, pulling no base image from any registry:
#
#   stage 1 (wheels):  SIE's wheel from this checkout + every dependency as a BINARY wheel for CPython 3.11
#                      on manylinux x86_64 (pip --only-binary=:all:): nothing is compiled, anywhere
#   stage 2 (runtime): a minimal Debian bookworm rootfs from Debian's own packages (mmdebstrap --variant
#                      minbase: python3 + ca-certificates; no compiler, no pip), the wheels installed into
#                      /opt/sie/site-packages, a non-root user 10001, /usr/local/bin/sie
#   assembly:          umoci (OCI layout, three layers: debian, python deps, sie), skopeo -> a docker-archive
#                      tarball (`docker load`, `podman load`, `ctr images import`, `kind load image-archive`)
#
#   infra/image/build.sh [OUT_DIR]       default OUT_DIR: ~/.cache/sie/image
#   -> OUT_DIR/oci (OCI image layout, tag <version>), OUT_DIR/sie-<version>.docker.tar,
#      OUT_DIR/rootfs (the unpacked runtime, for infra/image/smoke.sh), OUT_DIR/size.txt
#
# Needs root (mmdebstrap's chroot, umoci unpack), mmdebstrap, umoci, skopeo (Debian packages), network to
# Debian's mirror and PyPI. Reruns reuse downloaded wheels (OUT_DIR/work/wheels).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
out="${1:-$HOME/.cache/sie/image}"
python="${PYTHON:-python3}"
suite=bookworm                       # CPython 3.11 (pyproject: requires-python >= 3.11)
pyver=3.11
platforms=(--platform manylinux_2_36_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64
           --platform manylinux2014_x86_64 --platform linux_x86_64)
for tool in mmdebstrap umoci skopeo; do
  command -v "$tool" >/dev/null || { echo "build.sh: $tool is missing: apt-get install mmdebstrap umoci skopeo" >&2; exit 3; }
done
version="$("$python" -c 'import tomllib,sys; print(tomllib.load(open(sys.argv[1],"rb"))["project"]["version"])' "$repo/pyproject.toml")"
work="$out/work"
mkdir -p "$work/wheels"
t0=$(date +%s)

echo "== stage 1: wheels (binary only)" >&2
rm -rf "$work/sie-wheel" && mkdir -p "$work/sie-wheel"
# a clean copy of the tracked files: no .venv, caches or build dirs leak into the wheel
git -C "$repo" ls-files -z | (cd "$repo" && tar --null -T - -cf -) | (rm -rf "$work/src" && mkdir -p "$work/src" && tar -xf - -C "$work/src")
"$python" -m pip wheel -q --no-deps --no-build-isolation -w "$work/sie-wheel" "$work/src"
wheel="$(ls "$work/sie-wheel"/sie-"$version"-*.whl)"
"$python" -m pip download -q --only-binary=:all: "${platforms[@]}" --python-version "$pyver" --implementation cp \
  -d "$work/wheels" "sie[k8s] @ file://$wheel"

echo "== stage 2: runtime rootfs (Debian $suite, minbase + python3)" >&2
rm -rf "$work/rootfs.tar" "$work/site" "$work/sie-site"
mmdebstrap --quiet --variant=minbase --include=python3,ca-certificates,tzdata \
  --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
  --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-include=/usr/share/doc/*/copyright' \
  --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/* "$1"/var/log/*' \
  --customize-hook='echo "sie:x:10001:10001:SIE:/var/cache/sie:/usr/sbin/nologin" >> "$1"/etc/passwd' \
  --customize-hook='echo "sie:x:10001:" >> "$1"/etc/group' \
  --customize-hook='mkdir -p "$1"/var/cache/sie "$1"/var/lib/sie/agent "$1"/opt/sie/site-packages && chown 10001:10001 "$1"/var/cache/sie "$1"/var/lib/sie/agent' \
  "$suite" "$work/rootfs.tar" http://deb.debian.org/debian
# everything into one target, then SIE itself split off: its own layer changes with every commit
"$python" -m pip install -q --no-index --find-links "$work/wheels" --only-binary=:all: "${platforms[@]}" \
  --python-version "$pyver" --implementation cp --target "$work/site" "sie[k8s] @ file://$wheel"
mkdir -p "$work/sie-site"
mv "$work/site/sie" "$work/site"/sie-"$version".dist-info "$work/sie-site/"
rm -rf "$work/site/bin"  # console scripts with this machine's interpreter in their #!; /usr/local/bin/sie below
find "$work/site" "$work/sie-site" -name __pycache__ -prune -exec rm -rf {} +

echo "== assembly: OCI layout with umoci" >&2
rm -rf "$out/oci" "$work/bundle"
umoci init --layout "$out/oci"
umoci new --image "$out/oci:$version"
umoci unpack --image "$out/oci:$version" "$work/bundle" >/dev/null
tar -xf "$work/rootfs.tar" -C "$work/bundle/rootfs"
umoci repack --refresh-bundle --history.created_by "mmdebstrap --variant=minbase $suite +python3" \
  --image "$out/oci:$version" "$work/bundle"
cp -a "$work/site/." "$work/bundle/rootfs/opt/sie/site-packages/"
# byte-compiled at build time, by the image's own python: the root filesystem is read-only at run time
chroot "$work/bundle/rootfs" /usr/bin/python3 -m compileall -q /opt/sie/site-packages >/dev/null || true
umoci repack --refresh-bundle --history.created_by "pip --only-binary=:all: (SIE's dependencies)" \
  --image "$out/oci:$version" "$work/bundle"
cp -a "$work/sie-site/." "$work/bundle/rootfs/opt/sie/site-packages/"
cat > "$work/bundle/rootfs/usr/local/bin/sie" <<'PY'
#!/usr/bin/python3
import sys
from sie.cli import main
sys.exit(main())
PY
chmod 0755 "$work/bundle/rootfs/usr/local/bin/sie"
chroot "$work/bundle/rootfs" /usr/bin/python3 -m compileall -q /opt/sie/site-packages/sie >/dev/null
umoci repack --refresh-bundle --history.created_by "SIE $version" --image "$out/oci:$version" "$work/bundle"
umoci config --image "$out/oci:$version" --tag "$version" \
  --config.user 10001:10001 --config.workingdir /var/cache/sie \
  --config.entrypoint /usr/local/bin/sie --config.cmd --help \
  --config.env PATH=/usr/local/bin:/usr/bin:/bin --config.env PYTHONPATH=/opt/sie/site-packages \
  --config.env PYTHONDONTWRITEBYTECODE=1 --config.env SIE_CACHE_DIR=/var/cache/sie \
  --config.label org.opencontainers.image.title=sie --config.label "org.opencontainers.image.version=$version" \
  --config.label "org.opencontainers.image.revision=$(git -C "$repo" rev-parse HEAD)"
umoci gc --layout "$out/oci"
rm -rf "$out/rootfs" && mv "$work/bundle/rootfs" "$out/rootfs" && rm -rf "$work/bundle"
rm -f "$out/sie-$version.docker.tar"
skopeo copy --quiet "oci:$out/oci:$version" "docker-archive:$out/sie-$version.docker.tar:sie:$version"

uncompressed=$(du -sb "$out/rootfs" | cut -f1)
compressed=$(du -cb "$out/oci/blobs/sha256"/* | tail -1 | cut -f1)
compilers=$(ls "$out/rootfs/usr/bin" | grep -E '^(gcc|cc|g\+\+|c\+\+|clang|ld|as|make)(-[0-9.]+)?$' || true)
{
  echo "SIE image $version built $(date -u +%Y-%m-%dT%H:%M:%SZ) in $(( $(date +%s) - t0 )) s by infra/image/build.sh"
  echo "  base: Debian $suite (mmdebstrap minbase + python3 $pyver), no image pulled"
  echo "  uncompressed root filesystem: $(( uncompressed / 1048576 )) MiB"
  echo "  OCI blobs (gzip layers + config): $(( compressed / 1048576 )) MiB"
  echo "  largest in /opt/sie/site-packages:"
  du -sm "$out/rootfs/opt/sie/site-packages"/* | sort -rn | sed -n '1,8s/^/    /p'
  echo "  compilers in the runtime: ${compilers:-none}"
} | tee "$out/size.txt"
echo "$out"
