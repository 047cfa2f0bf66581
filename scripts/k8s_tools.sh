#!/usr/bin/env bash
# Build the Kubernetes tools SIE's Kubernetes tests run against, from Go
# modules (no image registry), once per machine:
#
#   kube-apiserver  kube-apiserver 1.37 with an embedded etcd (scripts/k8s/main.go)
#   kubectl         the same binary, started as kubectl
#   helm            helm v3, `go install`ed
#   kubelet, kube-controller-manager, kube-scheduler, kube-proxy
#                   the node half (scripts/k8s/node/main.go, a module of its own),
#                   plus pause (the pods' sandbox) and pause.tar, its image, for
#                   scripts/k8s_node.sh (the one-node cluster)
#
# into ${SIE_K8S_TOOLS_DIR:-~/.cache/sie/k8s/v<K8S>-helm<HELM>}/bin. Idempotent:
# a tool whose stamp (version + hash of the Go sources) matches is not rebuilt,
# so CI keeps ~/.cache across runs and pays the ~13 min build once.
# Prints the bin directory on stdout (the last line); exits 3 when Go is missing.
#
#   scripts/k8s_tools.sh          build what is missing, print the bin dir
#   scripts/k8s_tools.sh --path   print the bin dir if the apiserver, kubectl and helm are built, else exit 1
#   scripts/k8s_tools.sh --node-path   the same for the node half (kubelet ... pause.tar)
#   scripts/k8s_tools.sh --no-node     build the apiserver, kubectl and helm only
set -euo pipefail
K8S_VERSION=1.37.2
HELM_VERSION=3.22.0
here="$(cd "$(dirname "$0")" && pwd)"
src="$here/k8s"
dir="${SIE_K8S_TOOLS_DIR:-$HOME/.cache/sie/k8s/v${K8S_VERSION}-helm${HELM_VERSION}}"
bin="$dir/bin"
src_hash="$(cat "$src/go.mod" "$src/go.sum" "$src/main.go" | sha256sum | cut -c1-16)"
k8s_stamp="k8s=$K8S_VERSION src=$src_hash"
node_hash="$(cat "$src/node/go.mod" "$src/node/go.sum" "$src/node/main.go" "$src/node/pause/main.go" | sha256sum | cut -c1-16)"
node_stamp="k8snode=$K8S_VERSION src=$node_hash"
helm_stamp="helm=$HELM_VERSION"

built() { [[ -x "$bin/$1" && -f "$dir/$1.stamp" && "$(cat "$dir/$1.stamp")" == "$2" ]]; }

if [[ "${1:-}" == "--path" ]]; then
  if built sie-k8s "$k8s_stamp" && built helm "$helm_stamp" && [[ -e "$bin/kubectl" ]]; then
    echo "$bin"; exit 0
  fi
  exit 1
fi
if [[ "${1:-}" == "--node-path" ]]; then
  if built sie-k8s-node "$node_stamp" && [[ -e "$bin/kubelet" && -f "$bin/pause.tar" ]]; then
    echo "$bin"; exit 0
  fi
  exit 1
fi

if ! command -v go >/dev/null; then
  echo "k8s_tools: Go is not installed (https://go.dev/dl, >= 1.26); the Kubernetes tests skip without it" >&2
  exit 3
fi
mkdir -p "$bin"
# Two concurrent builds (CI + a developer) would race on the same output:
# one lock per cache dir.
exec 9>"$dir/.lock"
flock 9

# -p 1 keeps a 2-core machine usable for the tests that run next to the build;
# SIE_K8S_BUILD_PARALLEL raises it on a bigger machine.
par="${SIE_K8S_BUILD_PARALLEL:-1}"
ldflags="-s -w -X k8s.io/component-base/version.gitVersion=v$K8S_VERSION"
ldflags+=" -X k8s.io/component-base/version.gitMajor=${K8S_VERSION%%.*}"
minor="${K8S_VERSION#*.}"; ldflags+=" -X k8s.io/component-base/version.gitMinor=${minor%%.*}"
ldflags+=" -X k8s.io/component-base/version.gitTreeState=clean"
ldflags+=" -X k8s.io/client-go/pkg/version.gitVersion=v$K8S_VERSION"
if ! built sie-k8s "$k8s_stamp"; then
  echo "k8s_tools: building kube-apiserver+etcd and kubectl $K8S_VERSION (~13 min on 2 cores, once)" >&2
  (cd "$src" && go build -p "$par" -trimpath -ldflags "$ldflags" -o "$bin/sie-k8s.tmp" .)
  mv -f "$bin/sie-k8s.tmp" "$bin/sie-k8s"
  ln -sfn sie-k8s "$bin/kube-apiserver"
  ln -sfn sie-k8s "$bin/kubectl"
  echo "$k8s_stamp" > "$dir/sie-k8s.stamp"
fi
if ! built helm "$helm_stamp"; then
  echo "k8s_tools: building helm $HELM_VERSION (once)" >&2
  GOBIN="$dir/gobin" go install -p "$par" -trimpath -ldflags "-s -w" "helm.sh/helm/v3/cmd/helm@v$HELM_VERSION"
  mv -f "$dir/gobin/helm" "$bin/helm"
  echo "$helm_stamp" > "$dir/helm.stamp"
fi
if [[ "${1:-}" != "--no-node" ]] && ! built sie-k8s-node "$node_stamp"; then
  echo "k8s_tools: building kubelet, kube-controller-manager, kube-scheduler, kube-proxy $K8S_VERSION (once)" >&2
  (cd "$src/node" && go build -p "$par" -trimpath -ldflags "$ldflags" -o "$bin/sie-k8s-node.tmp" .)
  (cd "$src/node" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$bin/pause" ./pause)
  # the sandbox image, as a docker archive `ctr images import` takes (no registry): one layer, /pause
  img="$(mktemp -d)"
  mkdir -p "$img/layer"
  cp "$bin/pause" "$img/layer/pause"
  tar --owner=0 --group=0 --numeric-owner --mtime=@0 -C "$img/layer" -cf "$img/layer.tar" pause
  layer_sha="$(sha256sum "$img/layer.tar" | cut -d' ' -f1)"
  printf '{"architecture":"amd64","os":"linux","config":{"Entrypoint":["/pause"]},"rootfs":{"type":"layers","diff_ids":["sha256:%s"]}}' \
    "$layer_sha" > "$img/config.json"
  config_sha="$(sha256sum "$img/config.json" | cut -d' ' -f1)"
  mv "$img/config.json" "$img/$config_sha.json"
  mkdir -p "$img/$layer_sha" && mv "$img/layer.tar" "$img/$layer_sha/layer.tar"
  printf '[{"Config":"%s.json","RepoTags":["sie.local/pause:1"],"Layers":["%s/layer.tar"]}]' "$config_sha" "$layer_sha" \
    > "$img/manifest.json"
  tar --owner=0 --group=0 --numeric-owner --mtime=@0 -C "$img" -cf "$bin/pause.tar" manifest.json "$config_sha.json" "$layer_sha"
  rm -rf "$img"
  mv -f "$bin/sie-k8s-node.tmp" "$bin/sie-k8s-node"
  for name in kubelet kube-controller-manager kube-scheduler kube-proxy; do ln -sfn sie-k8s-node "$bin/$name"; done
  echo "$node_stamp" > "$dir/sie-k8s-node.stamp"
fi
echo "$bin"
