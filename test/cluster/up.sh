#!/usr/bin/env bash
# up.sh starts a Kubernetes cluster built from real parts in network
# namespaces of this machine, with Sluice (or, with
# SLUICE_CLUSTER_PROXY=kube-proxy, kube-proxy in nftables mode) on every node:
#
#   netns slc-cp      etcd, kube-apiserver, kube-controller-manager,
#                     kube-scheduler; bridge br0 10.89.0.1/24, the node LAN
#   netns slc-nodeI   eth0 10.89.0.(10+I) on br0; containerd + runc, the
#                     standard CNI bridge (pods on cni0, a /24 of
#                     10.244.0.0/16 each), the kubelet, and the proxy
#
# With SLUICE_CLUSTER_DUALSTACK=1 the cluster is dual-stack, IPv4 first: the
# node LAN fd00:89::/64 (node I fd00:89::(10+I)), pods a /64 of fd00:244::/56
# per node, Services fd00:96::/112.
#
# Each node also has its own mount namespace (its sysfs, cgroup mounts, bpffs
# and stand-ins for the kernel tunables the kubelet would otherwise set on
# this machine), its own containerd state and its own cgroup subtree
# /slc-nodeI. Nothing outside those is touched: down.sh removes it all.
#
# The binaries come from .ci/install (k8s.io/kubernetes from test/kubernetes at the
# pinned versions, containerd and runc from test/containerd; the CNI plugins
# from Debian).
set -euo pipefail
source "$(dirname "$0")/lib.sh"

if [ -e "$STATE" ]; then
	echo "$STATE exists: a cluster is up (test/cluster/down.sh removes it)" >&2
	exit 1
fi
for b in etcd runc coredns regression-issue-74839 kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl agnhost containerd containerd-shim-runc-v2 ctr sluice kube-proxy; do
	if ! [ -x "$BIN/$b" ] && ! command -v "$b" >/dev/null; then
		echo "$b is missing: run .ci/install" >&2
		exit 1
	fi
done
[ -x /usr/lib/cni/bridge ] || {
	echo "the CNI plugins are missing: run .ci/install" >&2
	exit 1
}
bin() { if [ -x "$BIN/$1" ]; then echo "$BIN/$1"; else command -v "$1"; fi; }

mkdir -p "$STATE" "$DATA/logs"
# A private mount for the per-node mount namespace files (a namespace file
# can only be bound onto a private mount), as `ip netns` does for /run/netns.
mount --bind "$STATE" "$STATE"
mount --make-private "$STATE"
echo "$PROXY" >"$STATE/proxy"
echo "$DUALSTACK" >"$STATE/dualstack"

echo "== certificates and kubeconfigs"
pki=$STATE/pki
mkdir -p "$pki"
openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=slc-ca -keyout "$pki/ca.key" -out "$pki/ca.crt" 2>/dev/null
openssl req -newkey rsa:2048 -nodes -subj /CN=kube-apiserver -keyout "$pki/apiserver.key" -out "$pki/apiserver.csr" 2>/dev/null
printf 'subjectAltName=IP:%s,IP:10.96.0.1,IP:127.0.0.1,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local\n' "$CP_IP" >"$pki/san.ext"
openssl x509 -req -in "$pki/apiserver.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -CAcreateserial -days 2 -extfile "$pki/san.ext" -out "$pki/apiserver.crt" 2>/dev/null
openssl genrsa -out "$pki/sa.key" 2048 2>/dev/null
# Static tokens: the admin (control plane, proxies, e2e) and one per kubelet,
# in the groups the Node authorizer and NodeRestriction expect.
echo "$ADMIN_TOKEN,admin,admin,system:masters" >"$pki/tokens.csv"
kubeconfig() { # FILE TOKEN
	cat >"$1" <<EOF
apiVersion: v1
kind: Config
clusters: [{name: slc, cluster: {server: "$API", certificate-authority: "$pki/ca.crt"}}]
users: [{name: u, user: {token: "$2"}}]
contexts: [{name: slc, context: {cluster: slc, user: u}}]
current-context: slc
EOF
}
kubeconfig "$STATE/admin.kubeconfig" "$ADMIN_TOKEN"
for i in $(seq "$NODES"); do
	echo "slc-node$i-token,system:node:$(node_name "$i"),node$i,system:nodes" >>"$pki/tokens.csv"
	mkdir -p "$(node_dir "$i")"
	kubeconfig "$(node_dir "$i")/kubelet.kubeconfig" "slc-node$i-token"
done

echo "== network namespaces"
ip netns add "$CP_NS"
in_cp ip link set lo up
in_cp ip link add br0 type bridge
in_cp ip addr add "$CP_IP/24" dev br0
in_cp ip link set br0 up
in_cp sysctl -qw net.ipv4.ip_forward=1
if [ "$DUALSTACK" = 1 ]; then
	in_cp ip addr add "$CP_IP6/64" dev br0 nodad
	in_cp sysctl -qw net.ipv6.conf.all.forwarding=1
fi
clang-19 -O2 -target bpf -idirafter /usr/include/x86_64-linux-gnu -idirafter /usr/include/aarch64-linux-gnu \
	-c "$ROOT/test/cluster/xdp_pass.c" -o "$STATE/xdp_pass.o"
for i in $(seq "$NODES"); do
	ns=$(node_ns "$i")
	ip netns add "$ns"
	ip -n "$CP_NS" link add "n$i" type veth peer name eth0 netns "$ns"
	ip -n "$CP_NS" link set "n$i" master br0 up
	# The wire toward each node behaves as a NIC's, so Sluice's XDP
	# acceleration can run on the node's eth0 in driver mode: the port
	# completes a checksum a sender on this machine left partial (a NIC
	# never delivers a CHECKSUM_PARTIAL packet; a veth does), and runs an
	# XDP program that passes everything (xdp_pass.c), without which a
	# veth drops the frames its peer sends from XDP.
	ip netns exec "$CP_NS" ethtool -K "n$i" tx off >/dev/null
	ip -n "$CP_NS" link set dev "n$i" xdpdrv obj "$STATE/xdp_pass.o" sec xdp
	ip -n "$ns" link set lo up
	ip -n "$ns" addr add "$(node_ip "$i")/24" dev eth0
	ip -n "$ns" link set eth0 up
	ip -n "$ns" route add default via "$CP_IP"
	ip netns exec "$ns" sysctl -qw net.ipv4.ip_forward=1
	if [ "$DUALSTACK" = 1 ]; then
		ip -n "$ns" addr add "$(node_ip6 "$i")/64" dev eth0 nodad
		ip -n "$ns" -6 route add default via "$CP_IP6"
		ip netns exec "$ns" sysctl -qw net.ipv6.conf.all.forwarding=1
	fi
done

echo "== control plane"
# The controller manager refuses the per-family mask flags on a single-stack
# cluster, and the single one on a dual-stack cluster.
masks="--node-cidr-mask-size 24"
[ "$DUALSTACK" = 1 ] && masks="--node-cidr-mask-size-ipv4 24 --node-cidr-mask-size-ipv6 64"
start etcd "$DATA/logs/etcd.log" ip netns exec "$CP_NS" "$(bin etcd)" --data-dir "$DATA/etcd" \
	--listen-client-urls http://127.0.0.1:2379 --advertise-client-urls http://127.0.0.1:2379 \
	--listen-peer-urls http://127.0.0.1:2380 --initial-advertise-peer-urls http://127.0.0.1:2380 \
	--initial-cluster default=http://127.0.0.1:2380 --log-level warn
start kube-apiserver "$DATA/logs/kube-apiserver.log" ip netns exec "$CP_NS" "$(bin kube-apiserver)" \
	--etcd-servers http://127.0.0.1:2379 --bind-address 0.0.0.0 --secure-port 6443 --advertise-address "$CP_IP" \
	--tls-cert-file "$pki/apiserver.crt" --tls-private-key-file "$pki/apiserver.key" --client-ca-file "$pki/ca.crt" \
	--token-auth-file "$pki/tokens.csv" --authorization-mode Node,RBAC --enable-admission-plugins NodeRestriction \
	--allow-privileged --service-cluster-ip-range "$(dual "$SERVICE_CIDR" "$SERVICE_CIDR6")" --service-node-port-range 30000-32767 \
	--service-account-issuer https://kubernetes.default.svc.cluster.local \
	--service-account-key-file "$pki/sa.key" --service-account-signing-key-file "$pki/sa.key" \
	--kubelet-preferred-address-types InternalIP
wait_for "the API server" 90 kubectl_cp get --raw /readyz
start kube-controller-manager "$DATA/logs/kube-controller-manager.log" ip netns exec "$CP_NS" "$(bin kube-controller-manager)" \
	--kubeconfig "$STATE/admin.kubeconfig" --leader-elect=false --service-account-private-key-file "$pki/sa.key" \
	--root-ca-file "$pki/ca.crt" --allocate-node-cidrs --cluster-cidr "$(dual "$CLUSTER_CIDR" "$CLUSTER_CIDR6")" $masks \
	--service-cluster-ip-range "$(dual "$SERVICE_CIDR" "$SERVICE_CIDR6")" --configure-cloud-routes=false --use-service-account-credentials
start kube-scheduler "$DATA/logs/kube-scheduler.log" ip netns exec "$CP_NS" "$(bin kube-scheduler)" \
	--kubeconfig "$STATE/admin.kubeconfig" --leader-elect=false

echo "== images"
"$(dirname "$0")/images.sh" "$STATE/images.tar"

# The values the kubelet wants for kernel tunables that are not namespaced.
# Each node sees files holding them over /proc/sys, so the kubelet finds
# nothing to change; protectKernelDefaults makes it refuse to start rather
# than write to this machine if a stand-in were missing.
mkdir -p "$STATE/tunables"
declare -A tunables=([vm/overcommit_memory]=1 [vm/panic_on_oom]=0 [kernel/panic]=10 [kernel/panic_on_oops]=1
	[kernel/keys/root_maxkeys]=1000000 [kernel/keys/root_maxbytes]=25000000)
for t in "${!tunables[@]}"; do
	echo "${tunables[$t]}" >"$STATE/tunables/${t//\//_}"
done
# The nodes' own resolver, for pods with dnsPolicy Default (CoreDNS): this
# machine has no upstream DNS to offer, so it names an address nothing answers.
echo "nameserver 127.0.0.53" >"$STATE/resolv.conf"

for i in $(seq "$NODES"); do
	dir=$(node_dir "$i")
	data=$(node_data "$i")
	name=$(node_name "$i")
	echo "== $name"
	mkdir -p "$dir/bpf" "$dir/cni" "$data"
	mount -t bpf bpf "$dir/bpf"
	# The node's cgroup subtree, in every hierarchy; the node's own daemons
	# run in its "system" child, pods under the kubelet's "kubepods".
	for h in "${CGROUP_V1[@]}" systemd unified; do
		mkdir -p "/sys/fs/cgroup/$h/slc-$name/system"
	done
	# The node's mount namespace: sysfs of its netns, the machine's cgroup
	# hierarchies mounted again (sysfs hides them), the tunable stand-ins.
	touch "$dir/mnt"
	nsenter --net="/run/netns/$(node_ns "$i")" unshare --mount="$dir/mnt" --propagation slave sh -ec '
		mount -t sysfs sysfs /sys
		mount -t tmpfs cgroup /sys/fs/cgroup
		for c in '"${CGROUP_V1[*]}"'; do mkdir /sys/fs/cgroup/$c; mount -t cgroup -o $c cgroup /sys/fs/cgroup/$c; done
		mkdir /sys/fs/cgroup/systemd /sys/fs/cgroup/unified
		mount -t cgroup -o none,name=systemd cgroup /sys/fs/cgroup/systemd
		mount -t cgroup2 cgroup2 /sys/fs/cgroup/unified
		# What a node DaemonSet mounts as the host'"'"'s: the node'"'"'s bpffs at
		# /sys/fs/bpf, and its cgroup2 subtree at a path the same on every node.
		# Shared, as systemd makes every mount, so that a hostPath volume of
		# it may ask for mountPropagation HostToContainer.
		mount --bind '"$dir"'/bpf /sys/fs/bpf
		mount --make-shared /sys/fs/bpf
		mkdir /sys/fs/cgroup/node
		mount --bind /sys/fs/cgroup/unified/slc-'"$name"' /sys/fs/cgroup/node
		for t in '"${!tunables[*]}"'; do mount --bind '"$STATE"'/tunables/$(echo $t | tr / _) /proc/sys/$t; done'
	cat /sys/fs/cgroup/cpuset/cpuset.cpus >"/sys/fs/cgroup/cpuset/slc-$name/cpuset.cpus"
	cat /sys/fs/cgroup/cpuset/cpuset.mems >"/sys/fs/cgroup/cpuset/slc-$name/cpuset.mems"
	cat /sys/fs/cgroup/cpuset/cpuset.cpus >"/sys/fs/cgroup/cpuset/slc-$name/system/cpuset.cpus"
	cat /sys/fs/cgroup/cpuset/cpuset.mems >"/sys/fs/cgroup/cpuset/slc-$name/system/cpuset.mems"

	cat >"$dir/containerd.toml" <<EOF
version = 3
root = "$data/containerd"
state = "$dir/containerd"
[grpc]
  address = "$dir/containerd.sock"
[ttrpc]
  address = "$dir/containerd.ttrpc.sock"
[plugins.'io.containerd.nri.v1.nri']
  disable = true
[plugins.'io.containerd.cri.v1.runtime']
  enable_cdi = false
  # This machine withholds CAP_SYS_RESOURCE, so no process may lower its
  # oom_score_adj: the pause container's -998 and a Guaranteed pod's -997
  # are raised to containerd's own instead of failing the sandbox.
  restrict_oom_score_adj = true
  [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
    runtime_type = 'io.containerd.runc.v2'
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
      SystemdCgroup = false
      BinaryName = "$(bin runc)"
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ['/usr/lib/cni']
    conf_dir = "$dir/cni"
[plugins.'io.containerd.cri.v1.images']
  snapshotter = 'overlayfs'
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = 'registry.k8s.io/pause:3.10.2'
[plugins.'io.containerd.grpc.v1.cri']
  netns_mounts_under_state_dir = true
EOF
	node_daemon "$i" containerd env PATH="$BIN:$PATH" "$(bin containerd)" --config "$dir/containerd.toml"
	wait_for "containerd on $name" 30 in_node "$i" "$(bin ctr)" --address "$dir/containerd.sock" version
	in_node "$i" "$(bin ctr)" --address "$dir/containerd.sock" -n k8s.io images import --all-platforms "$STATE/images.tar" >/dev/null

	cat >"$dir/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: /slc-$name
failSwapOn: false
protectKernelDefaults: true
containerRuntimeEndpoint: unix://$dir/containerd.sock
address: $(node_ip "$i")
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
authentication: {anonymous: {enabled: true}, webhook: {enabled: false}}
authorization: {mode: AlwaysAllow}
podLogsDir: $data/pod-logs
resolvConf: $STATE/resolv.conf
clusterDomain: cluster.local
clusterDNS: [10.96.0.10]
serializeImagePulls: false
evictionHard: {memory.available: 100Mi, nodefs.available: 1%, imagefs.available: 1%}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
EOF
	node_daemon "$i" kubelet "$(bin kubelet)" --config "$dir/kubelet.yaml" --kubeconfig "$dir/kubelet.kubeconfig" \
		--hostname-override "$name" --node-ip "$(dual "$(node_ip "$i")" "$(node_ip6 "$i")")" --root-dir "$data/kubelet" --cert-dir "$data/kubelet-pki"
done

echo "== pod network"
node_has_pod_cidr() { [ -n "$(kubectl_cp get node "$1" -o 'jsonpath={.spec.podCIDR}')" ]; }
node_ready() { kubectl_cp get node "$1" -o 'jsonpath={.status.conditions[?(@.type=="Ready")].status}' | grep -qx True; }
for i in $(seq "$NODES"); do
	name=$(node_name "$i")
	wait_for "$name's pod CIDR" 90 node_has_pod_cidr "$name"
	cidr=$(kubectl_cp get node "$name" -o 'jsonpath={.spec.podCIDR}')
	echo "$cidr" >"$(node_dir "$i")/pod-cidr"
	in_cp ip route add "$cidr" via "$(node_ip "$i")"
	for j in $(seq "$NODES"); do
		[ "$i" = "$j" ] || ip -n "$(node_ns "$j")" route add "$cidr" via "$(node_ip "$i")"
	done
	ranges='[{"subnet": "'"$cidr"'"}]' routes='{"dst": "0.0.0.0/0"}'
	if [ "$DUALSTACK" = 1 ]; then
		cidr6=$(kubectl_cp get node "$name" -o 'jsonpath={.spec.podCIDRs[1]}')
		[ -n "$cidr6" ] || { echo "$name has no IPv6 pod CIDR" >&2; exit 1; }
		in_cp ip -6 route add "$cidr6" via "$(node_ip6 "$i")"
		for j in $(seq "$NODES"); do
			[ "$i" = "$j" ] || ip -n "$(node_ns "$j")" -6 route add "$cidr6" via "$(node_ip6 "$i")"
		done
		ranges+=', [{"subnet": "'"$cidr6"'"}]' routes+=', {"dst": "::/0"}'
	fi
	cat >"$(node_dir "$i")/cni/10-slc.conflist" <<EOF
{"cniVersion": "1.0.0", "name": "slc", "plugins": [
  {"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": false, "hairpinMode": true,
   "ipam": {"type": "host-local", "ranges": [$ranges], "routes": [$routes],
            "dataDir": "$(node_dir "$i")/ipam"}},
  {"type": "portmap", "capabilities": {"portMappings": true}}
]}
EOF
done

echo "== $PROXY"
"$(dirname "$0")/proxy.sh" start

for i in $(seq "$NODES"); do
	wait_for "$(node_name "$i") Ready" 120 node_ready "$(node_name "$i")"
done
echo "== cluster DNS"
kubectl_cp apply -f "$(dirname "$0")/coredns.yaml" >/dev/null
kubectl_cp -n kube-system rollout status deploy/coredns --timeout=120s >/dev/null
echo "cluster up: KUBECONFIG=$STATE/admin.kubeconfig, in netns $CP_NS (ip netns exec $CP_NS $BIN/kubectl get nodes)"
