#!/usr/bin/env bash
# conformance.sh OUTDIR [FOCUS] runs Kubernetes' own sig-network e2e specs
# (test/kubernetes/e2e, built from k8s.io/kubernetes by .ci/install) against
# the cluster up.sh brought up, in parallel, and writes OUTDIR/report.json
# (ginkgo's) and OUTDIR/results.tsv: one line per spec, "passed|failed|...
# <TAB> name". Its exit status is the suite's.
#
# FOCUS defaults to the issue's whole set: Services, Networking, Conntrack,
# EndpointSlice(Mirroring) and NetworkPolicy/Netpol. SKIP names what this
# cluster cannot run, whatever proxies it (each reason in SKIP_REASONS);
# SLUICE_E2E_PROCS sets the parallelism (default 4). --num-nodes is given:
# the framework counts the nodes on its first process only, and specs that
# need two nodes skip themselves on the others.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
out=${1:?usage: conformance.sh OUTDIR [FOCUS]}
focus=${2:-'\[sig-network\] (Services|Networking|Conntrack|EndpointSlice|EndpointSliceMirroring|NetworkPolicy|Netpol) '}

# What is skipped, and why (test/conformance/README.md lists the same).
SKIP_REASONS=(
	'SCTP::this kernel has no SCTP sockets, which the specs open in their pods'
	'Feature:Networking-IPv6::its one spec reaches the Internet over IPv6, which this machine cannot'
	'Internet connection::this machine has no Internet access'
	'Feature:Networking-Performance::needs the iperf2 image, not built here'
	'Disruptive::restarts components over SSH, which provider local lacks (proxy restarts are measured by restart.sh)'
	'Type LoadBalancer::needs a cloud load balancer'
)
skip=""
for r in "${SKIP_REASONS[@]}"; do
	skip+="${skip:+|}${r%%::*}"
done

mkdir -p "$out"
out=$(cd "$out" && pwd)
set +e
in_cp "$BIN/ginkgo" --procs "${SLUICE_E2E_PROCS:-4}" --timeout 3h --output-dir "$out" --json-report report.json \
	--focus "$focus" --skip "$skip" --no-color --succinct \
	"$BIN/e2e.test" -- --kubeconfig "$STATE/admin.kubeconfig" --provider local --num-nodes "$NODES" \
	--kubectl-path "$BIN/kubectl" --report-dir "$out" >"$out/e2e.log" 2>&1
rc=$?
set -e
jq -r '.[0].SpecReports[] | select(.LeafNodeType == "It" and .State != "skipped")
	| [.State, ((.ContainerHierarchyTexts // []) + [.LeafNodeText] | join(" "))] | @tsv' \
	"$out/report.json" | sort -k2 >"$out/results.tsv"
cut -f1 "$out/results.tsv" | sort | uniq -c
exit $rc
