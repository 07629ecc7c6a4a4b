#!/usr/bin/env bash
# measure.sh prints, for the proxy on every node, its resident memory, the
# CPU time it has used and its average CPU use since it started, with the
# count of Services, EndpointSlices and Pods the cluster holds.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
PROXY=$(cat "$STATE/proxy")
hz=$(getconf CLK_TCK)
boot=$(awk '/^btime/ {print $2}' /proc/stat)
echo "services=$(kubectl_cp get svc -A --no-headers | wc -l) endpointslices=$(kubectl_cp get endpointslices -A --no-headers | wc -l) pods=$(kubectl_cp get pods -A --no-headers | wc -l)"
for i in $(seq "$NODES"); do
	pid=$(cat "$STATE/pids/$PROXY-$(node_name "$i")")
	read -r utime stime start < <(awk '{print $14, $15, $22}' "/proc/$pid/stat")
	rss=$(awk '/^VmRSS/ {print $2}' "/proc/$pid/status")
	cpu=$(((utime + stime) * 1000 / hz))
	age=$(($(date +%s) - boot - start / hz))
	awk -v n="$(node_name "$i")" -v p="$PROXY" -v rss="$rss" -v cpu="$cpu" -v age="$age" \
		'BEGIN { printf "%s %s rss=%.0fMiB cpu=%.1fs over %ds (%.2f%% of a core)\n", n, p, rss / 1024, cpu / 1000, age, cpu / 10 / (age > 0 ? age : 1) }'
done
