#!/usr/bin/env bash
# restart.sh PERIOD restarts the proxy on one node after another, every
# PERIOD seconds, until it is killed: run beside conformance.sh, it checks
# that a restart of Sluice on a node during the run fails no spec. Each
# restart is logged with its time and how long the proxy took to be healthy.
set -euo pipefail
dir=$(dirname "$0")
source "$dir/lib.sh"
period=${1:?usage: restart.sh PERIOD}
i=1
while sleep "$period"; do
	t0=$(date +%s.%N)
	"$dir/proxy.sh" restart "$i"
	echo "$(date -u +%T) restarted the proxy on $(node_name "$i"), healthy after $(echo "$(date +%s.%N) - $t0" | bc | cut -c1-5)s"
	i=$((i % NODES + 1))
done
