# Shared settings of the conformance cluster (sourced by up.sh, down.sh and
# conformance.sh). Everything the cluster makes lives under $STATE and $DATA,
# in network namespaces named slc-*, in cgroups named /slc-* and in nothing
# else: down.sh removes exactly these.

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BIN=${SLUICE_CLUSTER_BIN:-$ROOT/.bin}
STATE=${SLUICE_CLUSTER_STATE:-/run/slc-cluster}
DATA=${SLUICE_CLUSTER_DATA:-/var/lib/slc-cluster}
NODES=${SLUICE_CLUSTER_NODES:-2}
# PROXY is what proxies Services on every node: sluice or kube-proxy (nftables).
PROXY=${SLUICE_CLUSTER_PROXY:-sluice}

CP_NS=slc-cp                 # etcd, control plane, the e2e runner and kubectl
CP_IP=10.89.0.1              # the control plane's address on the node LAN
NODE_NET=10.89.0             # node LAN; node i is $NODE_NET.$((10+i))
CLUSTER_CIDR=10.244.0.0/16   # pods; the controller manager gives each node a /24
SERVICE_CIDR=10.96.0.0/16
# SLUICE_CLUSTER_DUALSTACK=1 makes the cluster dual-stack (IPv4 primary): the
# node LAN, pods and Services get an IPv6 range each too.
# up.sh records the choice, so the other scripts follow the running cluster.
DUALSTACK=${SLUICE_CLUSTER_DUALSTACK:-$(cat "$STATE/dualstack" 2>/dev/null || echo 0)}
CP_IP6=fd00:89::1
CLUSTER_CIDR6=fd00:244::/56  # each node gets a /64
SERVICE_CIDR6=fd00:96::/112
API=https://$CP_IP:6443
ADMIN_TOKEN=slc-admin-token

# The cgroup v1 controllers of this machine (it runs a hybrid hierarchy: v1
# controllers, with an empty cgroup2 at /sys/fs/cgroup/unified).
CGROUP_V1=(cpu cpuacct cpuset memory devices freezer blkio pids)

node_name() { echo "node$1"; }
node_ns() { echo "slc-node$1"; }
node_ip() { echo "$NODE_NET.$((10 + $1))"; }
node_ip6() { echo "fd00:89::$((10 + $1))"; }
# dual V4 V6 is "V4,V6" on a dual-stack cluster, else V4.
dual() { if [ "$DUALSTACK" = 1 ]; then echo "$1,$2"; else echo "$1"; fi; }
node_dir() { echo "$STATE/node$1"; }
node_data() { echo "$DATA/node$1"; }

# in_node I CMD... runs CMD in node I's network and mount namespaces: the
# mount namespace holds the node's sysfs, cgroup mounts and kernel-tunable
# stand-ins (up.sh), and is shared by containerd, the kubelet and the proxy so
# that the kubelet's volume mounts are what containerd sees.
in_node() {
	local i=$1
	shift
	nsenter --net="/run/netns/$(node_ns "$i")" --mount="$(node_dir "$i")/mnt" -- "$@"
}

in_cp() { ip netns exec "$CP_NS" "$@"; }

kubectl_cp() { in_cp "$BIN/kubectl" --kubeconfig "$STATE/admin.kubeconfig" "$@"; }

# start NAME LOGFILE CMD... runs CMD detached, recording its pid for down.sh.
start() {
	local name=$1 log=$2
	shift 2
	mkdir -p "$STATE/pids" "$(dirname "$log")"
	setsid "$@" >>"$log" 2>&1 </dev/null &
	echo $! >"$STATE/pids/$name"
}

# stop NAME ends what start NAME started: SIGTERM, then SIGKILL after 10 s.
stop() {
	local f=$STATE/pids/$1 pid
	[ -f "$f" ] || return 0
	pid=$(cat "$f")
	if kill -TERM "$pid" 2>/dev/null; then
		for _ in $(seq 100); do
			kill -0 "$pid" 2>/dev/null || break
			sleep 0.1
		done
		kill -KILL "$pid" 2>/dev/null || true
	fi
	rm -f "$f"
}

# wait_for WHAT SECONDS CMD... retries CMD every second until it succeeds.
wait_for() {
	local what=$1 secs=$2
	shift 2
	for _ in $(seq "$secs"); do
		if "$@" >/dev/null 2>&1; then
			return 0
		fi
		sleep 1
	done
	echo "timed out after ${secs}s waiting for $what" >&2
	return 1
}

# node_daemon I NAME CMD... starts CMD as node I's daemon NAME: in the node's
# namespaces (in_node) and in its cgroup slc-nodeI/system of every hierarchy,
# so that down.sh finds it and whatever it leaves behind.
node_daemon() {
	local i=$1 name=$2 procs="" h
	shift 2
	for h in "${CGROUP_V1[@]}" systemd unified; do
		procs+=" /sys/fs/cgroup/$h/slc-$(node_name "$i")/system/cgroup.procs"
	done
	start "$name-$(node_name "$i")" "$DATA/logs/$name-$(node_name "$i").log" \
		sh -c 'for f in '"$procs"'; do echo $$ >"$f"; done; exec "$@"' sh \
		nsenter --net="/run/netns/$(node_ns "$i")" --mount="$(node_dir "$i")/mnt" -- "$@"
}
