#!/usr/bin/env bash
# proxy.sh start|stop|restart [I] runs the cluster's Service proxy on node I
# (default: every node): `sluice agent`, or kube-proxy in nftables mode when
# the cluster was brought up with SLUICE_CLUSTER_PROXY=kube-proxy. With
# SLUICE_CLUSTER_PROXY=daemonset, start applies kube-proxy as kubeadm runs it,
# a DaemonSet (kube-proxy.yaml), on every node at once; migrate.sh then
# replaces it with Sluice's chart.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
PROXY=$(cat "$STATE/proxy")

start_proxy() {
	local i=$1 dir name
	dir=$(node_dir "$i")
	name=$(node_name "$i")
	case $PROXY in
	sluice)
		# The socket-level load balancer attaches to the node's cgroup2
		# subtree, which holds its daemons and its pods.
		node_daemon "$i" sluice "$BIN/sluice" agent --kubeconfig "$STATE/admin.kubeconfig" \
			--hostname-override "$name" --cluster-cidr "$(dual "$CLUSTER_CIDR" "$CLUSTER_CIDR6")" --bpf-pin-dir "$dir/bpf/sluice" \
			--cgroup "/sys/fs/cgroup/unified/slc-$name" --data-ifaces '^eth0$' \
			--healthz-bind-address 0.0.0.0:10256 --metrics-bind-address 127.0.0.1:10249
		;;
	kube-proxy)
		# The conntrack settings at 0 leave this machine's nf_conntrack
		# sysctls as they are.
		node_daemon "$i" kube-proxy "$BIN/kube-proxy" --kubeconfig "$STATE/admin.kubeconfig" \
			--hostname-override "$name" --proxy-mode nftables --cluster-cidr "$(dual "$CLUSTER_CIDR" "$CLUSTER_CIDR6")" \
			--conntrack-max-per-core 0 --conntrack-tcp-timeout-established 0 --conntrack-tcp-timeout-close-wait 0 \
			--healthz-bind-address 0.0.0.0:10256 --metrics-bind-address 127.0.0.1:10249
		;;
	daemonset)
		echo "daemonset: kube-proxy runs as a DaemonSet on every node; migrate.sh replaces it" >&2
		exit 1
		;;
	*)
		echo "unknown proxy $PROXY" >&2
		exit 1
		;;
	esac
}

healthy() { in_node "$1" bash -c 'exec 3<>/dev/tcp/127.0.0.1/10256 && printf "GET /healthz HTTP/1.0\r\n\r\n" >&3 && head -1 <&3 | grep -q " 200"'; }

nodes=${2:-$(seq "$NODES")}
case ${1:?usage: proxy.sh start|stop|restart [node]} in
start)
	if [ "$PROXY" = daemonset ]; then
		sed -e "s|@API@|$API|" -e "s|@CLUSTER_CIDR@|$(dual "$CLUSTER_CIDR" "$CLUSTER_CIDR6")|" "$(dirname "$0")/kube-proxy.yaml" |
			kubectl_cp apply -f - >/dev/null
		kubectl_cp -n kube-system rollout status ds/kube-proxy --timeout=120s >/dev/null
	else
		for i in $nodes; do
			start_proxy "$i"
		done
	fi
	for i in $nodes; do
		wait_for "$PROXY on $(node_name "$i") healthy" 60 healthy "$i"
	done
	;;
restart)
	for i in $nodes; do
		[ "$1" = restart ] && stop "$PROXY-$(node_name "$i")"
		start_proxy "$i"
	done
	for i in $nodes; do
		wait_for "$PROXY on $(node_name "$i") healthy" 60 healthy "$i"
	done
	;;
stop)
	for i in $nodes; do
		stop "$PROXY-$(node_name "$i")"
	done
	;;
esac
