#!/usr/bin/env bash
# compare.sh SLUICE_OUTDIR KUBE_PROXY_OUTDIR prints a Markdown table of every
# spec either run ran: its result with Sluice and with kube-proxy (nftables),
# Sluice-only failures first, then a count of each combination.
set -euo pipefail
s=${1:?usage: compare.sh SLUICE_OUTDIR KUBE_PROXY_OUTDIR}
k=${2:?usage: compare.sh SLUICE_OUTDIR KUBE_PROXY_OUTDIR}
join -t $'\t' -1 2 -2 2 -a 1 -a 2 -e - -o 0,1.1,2.1 \
	<(sort -t $'\t' -k2 "$s/results.tsv") <(sort -t $'\t' -k2 "$k/results.tsv") >"$s/compare.tsv"
echo "| spec | Sluice | kube-proxy |"
echo "|---|---|---|"
awk -F'\t' '$2 != "passed" && $3 == "passed"' "$s/compare.tsv" | sort | awk -F'\t' '{printf "| %s | **%s** | %s |\n", $1, $2, $3}'
awk -F'\t' '!($2 != "passed" && $3 == "passed")' "$s/compare.tsv" | sort | awk -F'\t' '{printf "| %s | %s | %s |\n", $1, $2, $3}'
echo
echo "Sluice / kube-proxy: $(awk -F'\t' '{print $2 "/" $3}' "$s/compare.tsv" | sort | uniq -c | awk '{printf "%s%s %s", sep, $1, $2; sep=", "}')"
