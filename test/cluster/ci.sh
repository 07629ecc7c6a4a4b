#!/usr/bin/env bash
# ci.sh [OUTDIR] is the quick conformance check .ci/run makes: a two-node
# cluster that starts with kube-proxy as a DaemonSet, moved to Sluice's Helm
# chart and upgraded from the previous commit's image to this one's without
# losing a connection (migrate.sh), then a handful of upstream Services and
# Conntrack specs and one NetworkPolicy spec against it, then down.sh, which
# must leave nothing behind. On a failure it prints what failed and the tail
# of every node's agent and kubelet log.
set -uo pipefail
dir=$(cd "$(dirname "$0")" && pwd)
source "$dir/lib.sh"
out=${1:-/tmp/sluice-conformance-ci}
focus='\[sig-network\] (Services should (serve a basic endpoint from pods|serve multiport endpoints from pods|allow pods to hairpin back to themselves through services|be able to create a functioning NodePort service|be rejected when no endpoints exist|preserve source pod IP for traffic thru service cluster IP|have session affinity work for service with type clusterIP)|Conntrack should be able to preserve UDP traffic when server pod cycles for a ClusterIP service$|Netpol NetworkPolicy between server and client should support a .default-deny-ingress. policy)'

rc=0
SLUICE_CLUSTER_PROXY=daemonset "$dir/up.sh" || rc=$?
if [ $rc = 0 ]; then
	"$dir/migrate.sh" "$out" "${SLUICE_UPGRADE_FROM:-HEAD~1}" || rc=$?
	cat "$out/migrate.txt" 2>/dev/null | grep -v '^OK '
fi
if [ $rc = 0 ]; then
	SLUICE_E2E_PROCS=4 "$dir/conformance.sh" "$out" "$focus" || rc=$?
	# The specs ran with the XDP acceleration on (migrate.sh): what it carried.
	for i in $(seq "$NODES"); do
		echo "$(node_name "$i") XDP: $(in_node "$i" curl -s 127.0.0.1:10249/metrics | grep '^sluice_xdp_packets_total' |
			sed 's/sluice_xdp_packets_total{decision="\(.*\)"}/\1/' | tr '\n' ' ')"
	done
fi
if [ $rc != 0 ]; then
	grep -h -A3 '\[FAILED\]' "$out/e2e.log" 2>/dev/null | head -60
	for f in "$DATA"/node*/pod-logs/kube-system_sluice-*/sluice/*.log "$DATA"/logs/kubelet-*.log; do
		[ -f "$f" ] && { echo "== $f"; tail -20 "$f"; }
	done
fi
"$dir/down.sh" || rc=1
exit $rc
