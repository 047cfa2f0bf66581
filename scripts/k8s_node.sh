#!/usr/bin/env bash
# A one-node Kubernetes cluster on this machine, for SIE's in-cluster tests (tests/k8s/test_pods_*.py):
#
#   kube-apiserver (+ embedded etcd), kube-controller-manager, kube-scheduler, kube-proxy (nftables, a table
#   of its own), kubelet (cgroupfs driver; failCgroupV1: false on a cgroup v1 host), containerd (Debian's,
#   runc) and the CNI bridge plugin (Debian's containernetworking-plugins), plus scripts/k8s_dns.py
#   answering the cluster's Service names. Binaries: scripts/k8s_tools.sh (~/.cache/sie/k8s, built once).
#
#   scripts/k8s_node.sh up      start it (a killed earlier run is cleaned first); waits for the node to be
#                               Ready; prints `export KUBECONFIG=... SIE_K8S_NODE_IP=...` lines (eval them)
#   scripts/k8s_node.sh down    stop everything it started and remove what it made: processes (by the pids
#                               it recorded, and containerd's shims by its socket path), the pods' cgroups,
#                               every mount under the state dir, the network namespaces, the bridge, the
#                               nftables table, the sysctls the kubelet set (restored). Safe to run twice.
#   scripts/k8s_node.sh status  what of it runs (exit 0 when the node is up)
#   scripts/k8s_node.sh import IMAGE.tar   load an image archive into its containerd (no registry)
#
# Network: pods get addresses on the bridge sie-k8s0 (SIE_K8S_POD_CIDR, default 10.217.0.0/24) that this
# script makes; the node's address is the bridge's (.1), where the apiserver, the kubelet and the DNS
# stand-in listen. No NAT to the outside (ipMasq off, no default route off the bridge): pods reach the node
# and each other, nothing else. Services: SIE_K8S_SERVICE_CIDR (10.218.0.0/24), kube-proxy in nftables mode.
#
# State: SIE_K8S_NODE_DIR (default ~/.cache/sie/k8s/node): pki, kubeconfigs, logs, containerd's root (the
# imported images stay across runs), pids. One node per machine (a lock on the state dir).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
state="${SIE_K8S_NODE_DIR:-$HOME/.cache/sie/k8s/node}"
pod_cidr="${SIE_K8S_POD_CIDR:-10.217.0.0/24}"
svc_cidr="${SIE_K8S_SERVICE_CIDR:-10.218.0.0/24}"
bridge=sie-k8s0
node_name=sie-node
prefix="${pod_cidr%.*}"            # 10.217.0
node_ip="$prefix.1"
svc_ip="${svc_cidr%.*}.1"          # the `kubernetes` Service
dns_ip="$node_ip"                 # scripts/k8s_dns.py (outside the Service range, which kube-proxy guards)
api_port="${SIE_K8S_API_PORT:-16443}"
cgroup_root=sie-k8s                # the kubelet's pods: /sie-k8s/... in every cgroup v1 hierarchy
nft_table=kube-proxy               # kube-proxy's nftables tables (ip and ip6 families)
# what the kubelet sets, and net.ipv4.ip_forward (the bridge plugin's isGateway turns it on): put back by `down`
sysctls=(vm.overcommit_memory vm.panic_on_oom kernel.panic kernel.panic_on_oops kernel.keys.root_maxkeys
         kernel.keys.root_maxbytes net.ipv4.ip_forward)
run="$state/run"                   # per run: pids, logs, kubelet root, containerd state
cmd="${1:-}"

log() { echo "k8s_node: $*" >&2; }
die() { log "$*"; exit 1; }

tools_bin() {
  local bin
  bin="$("$here/k8s_tools.sh" --path 2>/dev/null)" || die "kube-apiserver/kubectl/helm are not built: scripts/k8s_tools.sh"
  "$here/k8s_tools.sh" --node-path >/dev/null 2>&1 || die "the kubelet is not built: scripts/k8s_tools.sh (~15 min, once)"
  echo "$bin"
}

need_host_tools() {
  local missing=()
  for t in containerd containerd-shim-runc-v2 runc ctr nft ip openssl; do command -v "$t" >/dev/null || missing+=("$t"); done
  [[ -x /usr/lib/cni/bridge && -x /usr/lib/cni/host-local && -x /usr/lib/cni/loopback ]] || missing+=("cni-plugins")
  if ((${#missing[@]})); then
    die "missing ${missing[*]}: apt-get install containerd runc containernetworking-plugins nftables iproute2 openssl"
  fi
  grep -q '^cgroup .*memory' /proc/mounts || die "no cgroup v1 memory hierarchy: this script drives a cgroup v1 host"
}

# ---------------------------------------------------------------------------------------------------- down
kill_pidfile() {  # TERM, wait up to $2 s, then KILL: a process this script started, by the pid it recorded
  local f="$1" wait_s="${2:-15}" pid
  [[ -f "$f" ]] || return 0
  pid="$(cat "$f")"
  # the pid is ours only while its command line still names our state dir (pids are reused)
  if [[ -n "$pid" ]] && { tr '\0' ' ' <"/proc/$pid/cmdline"; } 2>/dev/null | grep -qF -- "$state"; then
    kill -TERM "$pid" 2>/dev/null || true
    for ((i = 0; i < wait_s * 10; i++)); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
  fi
  rm -f "$f"
}

cgroup_dirs() {  # our cgroups in every v1 hierarchy, deepest first
  local h
  for h in /sys/fs/cgroup/*/; do
    [[ -d "$h$cgroup_root" ]] && find "$h$cgroup_root" -depth -type d
  done
  return 0
}

down() {
  [[ -d "$state" ]] || return 0
  # the control loops first (they would recreate what is removed below), the kubelet, then the pods'
  # processes, containerd and its shims
  for c in kube-controller-manager kube-scheduler kube-proxy dns kubelet; do kill_pidfile "$run/$c.pid" 15; done
  # every process in the pods' cgroups (containers and their shims' children): freeze-free kill, twice
  for _ in 1 2; do
    while read -r d; do
      [[ -f "$d/cgroup.procs" ]] && while read -r pid; do kill -KILL "$pid" 2>/dev/null || true; done <"$d/cgroup.procs"
    done < <(cgroup_dirs)
    sleep 0.2
  done
  kill_pidfile "$run/containerd.pid" 15
  # containerd's shims outlive it by design: ours carry our socket path on their command line
  local sock="$run/containerd.sock" p
  for p in /proc/[0-9]*; do
    if { tr '\0' ' ' <"$p/cmdline"; } 2>/dev/null | grep -qF -- "-address $sock"; then kill -KILL "${p#/proc/}" 2>/dev/null || true; fi
  done
  kill_pidfile "$run/kube-apiserver.pid" 30
  # mounts under the state dir (container rootfs overlays, pods' tmpfs volumes, network namespaces), deepest first
  local m
  for _ in 1 2 3; do
    while read -r m; do umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true; done < <(
      awk -v s="$state/" 'index($2, s) == 1 { print $2 }' /proc/self/mounts | sort -r)
  done
  while read -r d; do rmdir "$d" 2>/dev/null || true; done < <(cgroup_dirs)
  nft delete table ip "$nft_table" 2>/dev/null || true
  # the kubelet's own iptables chains (its canaries, and KUBE-FIREWALL: DNAT'ed traffic to 127/8 from outside
  # dropped), hooked into the host's INPUT/OUTPUT: removed with their jumps
  local ipt t
  for ipt in iptables ip6tables; do
    command -v "$ipt" >/dev/null || continue
    for t in INPUT OUTPUT; do while "$ipt" -w 5 -D "$t" -j KUBE-FIREWALL 2>/dev/null; do :; done; done
    "$ipt" -w 5 -F KUBE-FIREWALL 2>/dev/null || true; "$ipt" -w 5 -X KUBE-FIREWALL 2>/dev/null || true
    for t in mangle nat filter; do "$ipt" -w 5 -t "$t" -X KUBE-KUBELET-CANARY 2>/dev/null || true; done
    "$ipt" -w 5 -t mangle -X KUBE-IPTABLES-HINT 2>/dev/null || true
  done
  nft delete table ip6 "$nft_table" 2>/dev/null || true
  ip link del "$bridge" 2>/dev/null || true
  # veths of pods whose namespaces were unmounted above are gone with them; the kubelet's sysctls back
  if [[ -f "$state/sysctl.saved" ]]; then
    while read -r kv; do sysctl -qw "$kv" >/dev/null 2>&1 || true; done <"$state/sysctl.saved"
    rm -f "$state/sysctl.saved"
  fi
  if [[ -d "$run" ]]; then
    # kept for a look after the run: the logs; the rest of the run dir goes
    rm -rf "$state/last-logs" && mkdir -p "$state/last-logs" && cp -a "$run"/*.log "$state/last-logs/" 2>/dev/null || true
    awk -v s="$run" 'index($2, s) == 1 { found = 1 } END { exit !found }' /proc/self/mounts \
      && die "mounts are left under $run: $(awk -v s="$run" 'index($2, s) == 1 { print $2 }' /proc/self/mounts | head -3)"
    rm -rf --one-file-system "$run"
  fi
}

# ------------------------------------------------------------------------------------------------------ up
pki() {  # a CA, the apiserver's serving cert, its client cert for the kubelet, the service-account key
  # X.509 as strict verifiers want it (Python 3.13's ssl: key usage on the CA, key identifiers on leaves)
  local p="$state/pki" version=v2
  [[ "$(cat "$p/done" 2>/dev/null)" == "$version" ]] && return 0
  rm -rf "$p" && mkdir -p "$p"
  openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=sie-k8s-node-ca" \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
    -keyout "$p/ca.key" -out "$p/ca.crt" 2>/dev/null
  cat >"$p/apiserver.ext" <<EOF
subjectAltName=IP:$node_ip,IP:$svc_ip,IP:127.0.0.1,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local
basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth
subjectKeyIdentifier=hash
authorityKeyIdentifier=keyid,issuer
EOF
  openssl req -newkey rsa:2048 -nodes -subj "/CN=kube-apiserver" -keyout "$p/apiserver.key" -out "$p/apiserver.csr" 2>/dev/null
  openssl x509 -req -in "$p/apiserver.csr" -CA "$p/ca.crt" -CAkey "$p/ca.key" -CAcreateserial -days 3650 \
    -extfile "$p/apiserver.ext" -out "$p/apiserver.crt" 2>/dev/null
  printf 'basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=clientAuth\nsubjectKeyIdentifier=hash\nauthorityKeyIdentifier=keyid,issuer\n' >"$p/client.ext"
  openssl req -newkey rsa:2048 -nodes -subj "/O=system:masters/CN=kube-apiserver-kubelet-client" \
    -keyout "$p/kubelet-client.key" -out "$p/kubelet-client.csr" 2>/dev/null
  openssl x509 -req -in "$p/kubelet-client.csr" -CA "$p/ca.crt" -CAkey "$p/ca.key" -CAcreateserial -days 3650 \
    -extfile "$p/client.ext" -out "$p/kubelet-client.crt" 2>/dev/null
  openssl genrsa -out "$p/sa.key" 2048 2>/dev/null
  openssl rsa -in "$p/sa.key" -pubout -out "$p/sa.pub" 2>/dev/null
  echo "$version" >"$p/done"
}

kubeconfig() {  # kubeconfig FILE USER TOKEN
  cat >"$1" <<EOF
apiVersion: v1
kind: Config
clusters: [{name: sie-node, cluster: {server: "https://$node_ip:$api_port", certificate-authority: "$state/pki/ca.crt"}}]
users: [{name: $2, user: {token: "$3"}}]
contexts: [{name: sie-node, context: {cluster: sie-node, user: $2}}]
current-context: sie-node
EOF
}

start() {  # start NAME ARGS...: in a session of its own, its output in $run/NAME.log, its pid in $run/NAME.pid
  local name="$1"; shift
  setsid "$@" </dev/null >"$run/$name.log" 2>&1 8>&- &
  echo $! >"$run/$name.pid"
}

wait_for() {  # wait_for WHAT TIMEOUT_S CMD...: poll CMD until it succeeds; on timeout show the logs, fail
  local what="$1" timeout="$2"; shift 2
  local deadline=$((SECONDS + timeout))
  until "$@" >/dev/null 2>&1; do
    if ((SECONDS > deadline)); then
      log "$what: not after ${timeout}s; last log lines:"
      for f in "$run"/*.log; do echo "--- $f" >&2; tail -15 "$f" >&2; done
      return 1
    fi
    local c
    for c in kube-apiserver containerd kubelet; do
      if [[ -f "$run/$c.pid" ]] && ! kill -0 "$(cat "$run/$c.pid")" 2>/dev/null; then
        log "$c exited while waiting for $what:"; tail -30 "$run/$c.log" >&2; return 1
      fi
    done
    sleep 0.5
  done
}

up() {
  need_host_tools
  local bin
  bin="$(tools_bin)"
  down   # whatever a killed earlier run left
  mkdir -p "$run" "$state/cni" "$state/containerd"
  pki
  local admin_token kubelet_token cm_token sched_token proxy_token
  admin_token="$(openssl rand -hex 16)"; kubelet_token="$(openssl rand -hex 16)"; cm_token="$(openssl rand -hex 16)"
  sched_token="$(openssl rand -hex 16)"; proxy_token="$(openssl rand -hex 16)"
  cat >"$run/tokens.csv" <<EOF
$admin_token,admin,admin,"system:masters"
$kubelet_token,system:node:$node_name,node-$node_name,"system:nodes"
$cm_token,system:kube-controller-manager,kube-controller-manager
$sched_token,system:kube-scheduler,kube-scheduler
$proxy_token,system:kube-proxy,kube-proxy
EOF
  chmod 600 "$run/tokens.csv"
  kubeconfig "$run/admin.kubeconfig" admin "$admin_token"
  kubeconfig "$run/kubelet.kubeconfig" "system:node:$node_name" "$kubelet_token"
  kubeconfig "$run/cm.kubeconfig" system:kube-controller-manager "$cm_token"
  kubeconfig "$run/scheduler.kubeconfig" system:kube-scheduler "$sched_token"
  kubeconfig "$run/proxy.kubeconfig" system:kube-proxy "$proxy_token"

  # the node's network: the bridge (CNI attaches the pods' veths to it) with the node's address
  ip link add "$bridge" type bridge
  ip addr add "$node_ip/${pod_cidr#*/}" dev "$bridge"
  ip link set "$bridge" up
  # the kubelet and the bridge plugin set these; the values before are put back by `down`
  : >"$state/sysctl.saved"
  for k in "${sysctls[@]}"; do echo "$k=$(sysctl -n "$k")" >>"$state/sysctl.saved"; done

  local t0=$SECONDS
  start kube-apiserver env SIE_ETCD_DATA_DIR="$run/etcd" SIE_ETCD_CLIENT_URL=http://127.0.0.1:12379 \
    SIE_ETCD_PEER_URL=http://127.0.0.1:12380 "$bin/kube-apiserver" \
    --etcd-servers=http://127.0.0.1:12379 --bind-address="$node_ip" --advertise-address="$node_ip" \
    --secure-port="$api_port" --tls-cert-file="$state/pki/apiserver.crt" --tls-private-key-file="$state/pki/apiserver.key" \
    --client-ca-file="$state/pki/ca.crt" --token-auth-file="$run/tokens.csv" \
    --kubelet-client-certificate="$state/pki/kubelet-client.crt" --kubelet-client-key="$state/pki/kubelet-client.key" \
    --authorization-mode=Node,RBAC --enable-admission-plugins=NodeRestriction \
    --service-account-issuer=https://kubernetes.default.svc --service-account-key-file="$state/pki/sa.pub" \
    --service-account-signing-key-file="$state/pki/sa.key" --service-cluster-ip-range="$svc_cidr" \
    --kubelet-preferred-address-types=InternalIP --allow-privileged=false --profiling=false
  export KUBECONFIG="$run/admin.kubeconfig"
  wait_for "kube-apiserver /readyz" 180 "$bin/kubectl" get --raw /readyz
  log "apiserver ready after $((SECONDS - t0)) s"

  # containerd: everything under the run dir (root, state, socket, network namespaces); images in $state
  cat >"$run/containerd.toml" <<EOF
version = 2
root = "$state/containerd/root"
state = "$run/containerd-state"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.internal.v1.tracing"]
[grpc]
  address = "$run/containerd.sock"
[ttrpc]
  address = "$run/containerd.ttrpc.sock"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "sie.local/pause:1"
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_selinux = false
  disable_apparmor = true
  netns_mounts_under_state_dir = true
  # this VM's root lacks CAP_SYS_RESOURCE: runc cannot lower a pod's oom_score_adj below containerd's own
  # (the pause container's -998 failed: "failed to update /proc/self/oom_score_adj: Permission denied")
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        BinaryName = "${SIE_K8S_RUNC:-$(command -v runc)}"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$state/cni"
[plugins."io.containerd.internal.v1.opt"]
  path = "$state/containerd/opt"
EOF
  cat >"$state/cni/10-sie.conflist" <<EOF
{"cniVersion": "1.0.0", "name": "sie-k8s", "plugins": [
  {"type": "bridge", "bridge": "$bridge", "isGateway": true, "ipMasq": false, "hairpinMode": true,
   "ipam": {"type": "host-local", "ranges": [[{"subnet": "$pod_cidr", "gateway": "$node_ip"}]],
            "routes": [{"dst": "$svc_cidr"}], "dataDir": "$run/cni-ipam"}},
  {"type": "loopback"}]}
EOF
  start containerd containerd --config "$run/containerd.toml"
  wait_for "containerd" 60 ctr --address "$run/containerd.sock" version
  ctr --address "$run/containerd.sock" -n k8s.io images import "$bin/pause.tar" >/dev/null

  # the control loops; the controller-manager hands each controller a service-account token of its own
  start kube-controller-manager "$bin/kube-controller-manager" --kubeconfig="$run/cm.kubeconfig" \
    --use-service-account-credentials=true --service-account-private-key-file="$state/pki/sa.key" \
    --root-ca-file="$state/pki/ca.crt" --cluster-signing-cert-file="$state/pki/ca.crt" \
    --cluster-signing-key-file="$state/pki/ca.key" --leader-elect=false \
    --bind-address=127.0.0.1 --secure-port=0 --profiling=false
  start kube-scheduler "$bin/kube-scheduler" --kubeconfig="$run/scheduler.kubeconfig" --leader-elect=false \
    --bind-address=127.0.0.1 --secure-port=0 --profiling=false

  # the kubelet: a cgroup v1 host (KEP-5573), the cgroupfs driver, pods' cgroups under /$cgroup_root, which
  # must exist in every hierarchy (a cpuset one gets its parent's cpus and mems, or no task may join it)
  local h
  for h in /sys/fs/cgroup/*/; do
    [[ -f "${h}cgroup.procs" ]] || continue
    mkdir -p "$h$cgroup_root"
    if [[ -f "${h}cpuset.cpus" ]]; then
      cat "${h}cpuset.cpus" >"$h$cgroup_root/cpuset.cpus"; cat "${h}cpuset.mems" >"$h$cgroup_root/cpuset.mems"
    fi
  done
  printf 'nameserver %s\n' "$dns_ip" >"$run/resolv.conf"
  cat >"$run/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: /$cgroup_root
address: $node_ip
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
containerRuntimeEndpoint: unix://$run/containerd.sock
authentication: {anonymous: {enabled: false}, webhook: {enabled: true}, x509: {clientCAFile: "$state/pki/ca.crt"}}
authorization: {mode: Webhook}
clusterDNS: [$dns_ip]
clusterDomain: cluster.local
resolvConf: $run/resolv.conf
failSwapOn: false
protectKernelDefaults: false
podCIDR: $pod_cidr
maxPods: 60
serializeImagePulls: false
evictionHard: {memory.available: 200Mi, nodefs.available: 3%, imagefs.available: 3%}
imageGCHighThresholdPercent: 99
imageGCLowThresholdPercent: 98
EOF
  start kubelet "$bin/kubelet" --config="$run/kubelet.yaml" --kubeconfig="$run/kubelet.kubeconfig" \
    --root-dir="$run/kubelet" --cert-dir="$run/kubelet-pki" --hostname-override="$node_name" --node-ip="$node_ip" \
    --v=1
  cat >"$run/proxy.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: "$run/proxy.kubeconfig"}
mode: nftables
hostnameOverride: $node_name
bindAddress: $node_ip
clusterCIDR: $pod_cidr
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
nodePortAddresses: ["$node_ip/32"]
nftables: {masqueradeAll: true}
conntrack: {maxPerCore: 0, min: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}   # leave the host's sysctls alone
EOF
  start kube-proxy "$bin/kube-proxy" --config="$run/proxy.yaml"
  if [[ -x "$here/k8s_dns.py" ]]; then
    echo "$admin_token" >"$run/dns.token" && chmod 600 "$run/dns.token"
    start dns "${PYTHON:-python3}" "$here/k8s_dns.py" --listen "$dns_ip" --server "https://$node_ip:$api_port" \
      --token-file "$run/dns.token" --ca "$state/pki/ca.crt"
  fi
  wait_for "node $node_name Ready" 240 bash -c \
    "'$bin/kubectl' get node '$node_name' -o jsonpath='{.status.conditions[?(@.type==\"Ready\")].status}' | grep -qx True"
  # a pod is admitted once its namespace's default service account exists (the controller-manager makes it)
  wait_for "service account default/default" 120 "$bin/kubectl" -n default get serviceaccount default
  log "node $node_name Ready after $((SECONDS - t0)) s"
  echo "export KUBECONFIG=$run/admin.kubeconfig SIE_K8S_NODE_IP=$node_ip SIE_K8S_NODE_NAME=$node_name SIE_K8S_BIN=$bin"
}

status() {
  local ok=0
  for c in kube-apiserver containerd kube-controller-manager kube-scheduler kubelet kube-proxy dns; do
    if [[ -f "$run/$c.pid" ]] && kill -0 "$(cat "$run/$c.pid")" 2>/dev/null; then echo "$c: running ($(cat "$run/$c.pid"))"
    else echo "$c: not running"; ok=1; fi
  done
  return $ok
}

mkdir -p "$state"
case "$cmd" in
  up)
    exec 8>"$state/.lock"; flock -n 8 || die "another scripts/k8s_node.sh holds $state/.lock"
    up ;;
  down)
    exec 8>"$state/.lock"; flock -w 120 8 || die "another scripts/k8s_node.sh holds $state/.lock"
    down ;;
  status) status ;;
  import)
    [[ -f "${2:-}" ]] || die "usage: k8s_node.sh import IMAGE.tar"
    ctr --address "$run/containerd.sock" -n k8s.io images import "$2" ;;
  *) die "usage: k8s_node.sh up|down|status|import IMAGE.tar" ;;
esac
