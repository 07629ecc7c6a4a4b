#!/usr/bin/env bash
# migrate.sh OUTDIR [FROM] does what an operator does to a cluster that runs
# kube-proxy as a DaemonSet (up.sh with SLUICE_CLUSTER_PROXY=daemonset), with
# the commands the README's install section gives, and measures that no
# connection is lost on the way:
#
#   1. builds Sluice's image of FROM (default HEAD~1, the previous commit)
#      and of this checkout with deploy/image.sh, and imports both into
#      every node's containerd (there is no registry);
#   2. installs FROM's chart with FROM's image beside kube-proxy, on other
#      health and metrics ports than kube-proxy's: Sluice takes over the
#      connections kube-proxy's netfilter rules translated;
#   3. deletes kube-proxy's DaemonSet and runs `kube-proxy --cleanup` on
#      every node, as Cilium's and Calico's migration guides do;
#   4. upgrades the release to this checkout's chart and image, on
#      kube-proxy's ports and with a conntrack table of another size (a map
#      migrated under live traffic): a rolling update, one node after the
#      other.
#
# Throughout, an external client (the control plane's namespace, outside the
# cluster CIDR, so every flow is masqueraded) holds long-lived TCP
# connections to a NodePort of each node, each sending a line every 200 ms
# and reading its echo, and opens a new HTTP connection to each node's
# NodePort every 100 ms; the backends are on both nodes. It fails if any
# long-lived connection broke or any new connection failed, and writes what
# it measured to OUTDIR/migrate.txt.
set -euo pipefail
dir=$(cd "$(dirname "$0")" && pwd)
source "$dir/lib.sh"
out=${1:?usage: migrate.sh OUTDIR [FROM]}
from=${2:-HEAD~1}
mkdir -p "$out"
out=$(cd "$out" && pwd)
[ "$(cat "$STATE/proxy")" = daemonset ] || {
	echo "migrate.sh needs a cluster with kube-proxy as a DaemonSet: SLUICE_CLUSTER_PROXY=daemonset up.sh" >&2
	exit 1
}
HELM=${HELM:-$BIN/helm}
helm_cp() { in_cp "$HELM" --kubeconfig "$STATE/admin.kubeconfig" "$@"; }
log() { echo "$(date -u +%T) $*" | tee -a "$out/migrate.txt"; }
: >"$out/migrate.txt"

echo "== images: $from and this checkout"
work=$(mktemp -d)
prev=$work/prev
cleanup() {
	touch "$work/stop"
	wait 2>/dev/null
	git -C "$ROOT" worktree remove --force "$prev" 2>/dev/null
	rm -rf "$work"
}
trap cleanup EXIT
git -C "$ROOT" worktree add --detach -q "$prev" "$from"
for f in deploy/image.sh deploy/helm/sluice/Chart.yaml; do
	[ -e "$prev/$f" ] || {
		echo "$from has no $f: give migrate.sh a commit with the chart to upgrade from" >&2
		exit 1
	}
done
new_image=$("$ROOT/deploy/image.sh" "$work/new.tar")
old_image=$("$prev/deploy/image.sh" "$work/old.tar" "localhost/sluice:from-$(git -C "$prev" rev-parse --short HEAD)")
for i in $(seq "$NODES"); do
	for t in "$work/old.tar" "$work/new.tar"; do
		in_node "$i" "$BIN/ctr" --address "$(node_dir "$i")/containerd.sock" -n k8s.io images import "$t" >/dev/null
	done
done
log "images: from $old_image to $new_image"

echo "== the probe workload: a backend on each node, NodePorts 30080 (HTTP) and 30090 (TCP echo)"
kubectl_cp apply -f - >/dev/null <<'EOF'
apiVersion: v1
kind: Namespace
metadata: {name: slc-migrate}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: probe, namespace: slc-migrate}
spec:
  replicas: 2
  selector: {matchLabels: {app: probe}}
  template:
    metadata: {labels: {app: probe}}
    spec:
      topologySpreadConstraints:
      - {maxSkew: 1, topologyKey: kubernetes.io/hostname, whenUnsatisfiable: DoNotSchedule, labelSelector: {matchLabels: {app: probe}}}
      containers:
      - name: http
        image: registry.k8s.io/e2e-test-images/agnhost:2.66.1
        args: [netexec, --http-port=8080]
      - name: echo
        image: registry.k8s.io/e2e-test-images/agnhost:2.66.1
        command: [socat, "TCP-LISTEN:9000,fork,reuseaddr", "EXEC:cat"]
---
apiVersion: v1
kind: Service
metadata: {name: probe, namespace: slc-migrate}
spec:
  type: NodePort
  selector: {app: probe}
  ports:
  - {name: http, port: 80, targetPort: 8080, nodePort: 30080}
  - {name: echo, port: 9000, targetPort: 9000, nodePort: 30090}
EOF
kubectl_cp -n slc-migrate rollout status deploy/probe --timeout=120s >/dev/null
nodes_ips=()
for i in $(seq "$NODES"); do
	nodes_ips+=("$(node_ip "$i")")
done
for ip in "${nodes_ips[@]}"; do
	wait_for "NodePort 30080 on $ip through kube-proxy" 30 in_cp curl -sf -m 2 "http://$ip:30080/hostname"
done

# hold ID IP: one long-lived connection to IP:30090; a line every 200 ms,
# its echo read back within 5 s. Prints OK or FAIL with what it saw.
hold() {
	local n=0 line
	exec 3<>"/dev/tcp/$2/30090" || {
		echo "FAIL $1 $2: cannot connect"
		return
	}
	while [ ! -e "$STOP" ]; do
		echo "line $n" >&3 2>/dev/null
		line=""
		if ! read -r -t 5 line <&3 2>/dev/null || [ "$line" != "line $n" ]; then
			echo "FAIL $1 $2: after $n echoes, $(date -u +%T) got '${line:-nothing}'"
			return
		fi
		n=$((n + 1))
		sleep 0.2
	done
	echo "OK $1 $2: $n echoes"
}
# dial IP: a new HTTP connection to IP:30080 every 100 ms; prints a line per
# failure and the totals at the end.
dial() {
	local ok=0 failed=0
	while [ ! -e "$STOP" ]; do
		if curl -sf -m 2 -o /dev/null "http://$1:30080/hostname"; then
			ok=$((ok + 1))
		else
			failed=$((failed + 1))
			echo "FAILED $1 at $(date -u +%T)"
		fi
		sleep 0.1
	done
	echo "TOTAL $1 ok=$ok failed=$failed"
}
export STOP=$work/stop
for ip in "${nodes_ips[@]}"; do
	for c in 1 2 3 4 5; do
		in_cp bash -c "$(declare -f hold); hold $c $ip" >"$work/hold-$ip-$c" 2>&1 &
	done
	in_cp bash -c "$(declare -f dial); dial $ip" >"$work/dial-$ip" 2>&1 &
done
sleep 3
log "10 long-lived connections and the dialers started through kube-proxy"

echo "== helm install: $old_image beside kube-proxy, on other ports"
# Beside kube-proxy, its health and metrics ports are taken.
side=(--set config.healthz-bind-address=0.0.0.0:10266 --set config.metrics-bind-address=127.0.0.1:10259 --set healthzPort=10266)
helm_cp install sluice "$prev/deploy/helm/sluice" --namespace kube-system -f "$dir/sluice-values.yaml" \
	--set image.tag="${old_image##*:}" "${side[@]}"
kubectl_cp -n kube-system rollout status ds/sluice --timeout=180s
takeover_logged() { [ "$(kubectl_cp -n kube-system logs -l k8s-app=sluice | grep -c 'adopted the connections.* pass=2')" -ge "$NODES" ]; }
wait_for "the takeover's second pass on every node" 60 takeover_logged
# Each long-lived connection entered through one node, whose kube-proxy
# translated it: Sluice must have adopted every one.
adopted=$(kubectl_cp -n kube-system logs -l k8s-app=sluice | grep -o 'adopted the connections.* adopted=[0-9]*' |
	grep -o '[0-9]*$' | awk '{n += $1} END {print n + 0}')
log "sluice ($old_image) ready beside kube-proxy; it adopted $adopted connections kube-proxy had translated"
if [ "$adopted" -lt 10 ]; then
	echo "sluice adopted $adopted connections, fewer than the 10 long-lived ones" >&2
	exit 1
fi
sleep 3

echo "== kube-proxy removed"
kubectl_cp -n kube-system delete ds kube-proxy --wait=true >/dev/null
kube_proxy_gone() { [ -z "$(kubectl_cp -n kube-system get pods -l k8s-app=kube-proxy -o name)" ]; }
wait_for "kube-proxy's pods gone" 60 kube_proxy_gone
for i in $(seq "$NODES"); do
	in_node "$i" "$BIN/kube-proxy" --cleanup >/dev/null 2>&1 || true
	if in_node "$i" nft list tables | grep -q kube-proxy; then
		echo "kube-proxy --cleanup left its tables on $(node_name "$i")" >&2
		exit 1
	fi
done
log "kube-proxy's DaemonSet deleted and its rules cleaned up on every node"
sleep 3

rc=0
echo "== helm upgrade: $new_image on kube-proxy's ports, one node after the other"
# The upgrade also sizes the conntrack table anew (kube-proxy's maxPerCore,
# which the agent would otherwise take as 0 from kube-proxy's file): each
# new agent moves the live entries into a map of the new size while the old
# programs still run (maps.Open with Migrate, as for an older layout).
# It also turns the XDP acceleration on, in driver mode (up.sh sets up the
# wire for it): the long-lived connections cross from TC to XDP, and the
# conformance specs after it run with it.
helm_cp upgrade sluice "$ROOT/deploy/helm/sluice" --namespace kube-system -f "$dir/sluice-values.yaml" \
	--set image.tag="${new_image##*:}" --set config.conntrack-max-per-core=65536 --set config.xdp-acceleration=native
kubectl_cp -n kube-system rollout status ds/sluice --timeout=180s
for i in $(seq "$NODES"); do
	if ! in_node "$i" "$BIN/sluice" iface list | grep -Eq '^[0-9]+ +eth0 +data +true +.* driver$'; then
		echo "$(node_name "$i"): eth0 does not run the XDP acceleration in driver mode:" >&2
		in_node "$i" "$BIN/sluice" iface list >&2
		rc=1
	fi
done
# The IPv4 table on every node; the IPv6 one too on a dual-stack cluster.
# On a single-stack one the agent gives the IPv6 tables their minimal size
# (--ipv6-tables=auto), which no conntrack flag grows.
logs=$(kubectl_cp -n kube-system logs -l k8s-app=sluice --tail=-1)
migrated=$(grep -Ec 'migrating a map.s entries into a new map.*from.{1,3}sl_ct_v2' <<<"$logs" || true)
migrated6=$(grep -Ec 'migrating a map.s entries into a new map.*from.{1,3}sl_ct6_v1' <<<"$logs" || true)
minimal6=$(grep -c 'IPv6 tables are minimal' <<<"$logs" || true)
log "sluice upgraded to $new_image on every node; conntrack tables migrated: $migrated IPv4, $migrated6 IPv6 ($NODES nodes); minimal IPv6 tables on $minimal6"
if [ "$migrated" -lt "$NODES" ]; then
	echo "the upgrade migrated $migrated IPv4 conntrack tables, not every node's $NODES" >&2
	rc=1
fi
if [ "$DUALSTACK" = 1 ] && [ "$migrated6" -lt "$NODES" ]; then
	echo "the upgrade migrated $migrated6 IPv6 conntrack tables on a dual-stack cluster, not every node's $NODES" >&2
	rc=1
fi
if [ "$DUALSTACK" != 1 ] && [ "$minimal6" -lt "$NODES" ]; then
	echo "IPv6 tables minimal on $minimal6 of $NODES single-stack nodes" >&2
	rc=1
fi
for i in $(seq "$NODES"); do
	wait_for "sluice on $(node_name "$i") healthy on 10256" 30 in_node "$i" curl -sf -m 2 http://127.0.0.1:10256/healthz
done
sleep 5

touch "$STOP"
wait
for f in "$work"/hold-* "$work"/dial-*; do
	cat "$f" >>"$out/migrate.txt"
done
held=$(cat "$work"/hold-* | grep -c '^OK' || true)
broken=$(cat "$work"/hold-* | grep -c '^FAIL' || true)
read -r dialed failed < <(cat "$work"/dial-* | awk '/^TOTAL/ {split($3, o, "="); split($4, f, "="); ok += o[2]; bad += f[2]} END {print ok + bad, bad + 0}')
log "long-lived connections kept: $held of $((held + broken)); new connections: $dialed, failed: $failed"
[ "$broken" = 0 ] && [ "$held" -gt 0 ] || rc=1
[ "$failed" = 0 ] && [ "$dialed" -gt 0 ] || rc=1
kubectl_cp -n kube-system logs -l k8s-app=sluice --prefix --tail 5 >>"$out/migrate.txt" || true
kubectl_cp delete namespace slc-migrate --wait=false >/dev/null
exit $rc
