#!/usr/bin/env bash
# ci.sh [OUTDIR] is the quick conformance check .ci/run makes: a two-node
# cluster with Sluice, a handful of upstream Services and Conntrack specs and
# one NetworkPolicy spec, then down.sh, which must leave nothing behind. On a
# failure it prints each failed spec's reason and the tail of every node's
# agent and kubelet log.
set -uo pipefail
dir=$(cd "$(dirname "$0")" && pwd)
source "$dir/lib.sh"
out=${1:-/tmp/sluice-conformance-ci}
focus='\[sig-network\] (Services should (serve a basic endpoint from pods|serve multiport endpoints from pods|allow pods to hairpin back to themselves through services|be able to create a functioning NodePort service|be rejected when no endpoints exist|preserve source pod IP for traffic thru service cluster IP|have session affinity work for service with type clusterIP)|Conntrack should be able to preserve UDP traffic when server pod cycles for a ClusterIP service$|Netpol NetworkPolicy between server and client should support a .default-deny-ingress. policy)'

rc=0
SLUICE_CLUSTER_PROXY=sluice "$dir/up.sh" || rc=$?
if [ $rc = 0 ]; then
	SLUICE_E2E_PROCS=4 "$dir/conformance.sh" "$out" "$focus" || rc=$?
fi
if [ $rc != 0 ]; then
	grep -h -A3 '\[FAILED\]' "$out/e2e.log" 2>/dev/null | head -60
	for f in "$DATA"/logs/sluice-*.log "$DATA"/logs/kubelet-*.log; do
		[ -f "$f" ] && { echo "== $f"; tail -20 "$f"; }
	done
fi
"$dir/down.sh" || rc=1
exit $rc
