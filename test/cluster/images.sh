#!/usr/bin/env bash
# images.sh OUT builds, without a registry, the container images the e2e
# specs run, as one OCI archive for `ctr images import`, under the names the
# e2e framework asks for (k8s.io/kubernetes/test/utils/image), so no image
# override is needed and nothing is ever pulled:
#   - agnhost: the upstream agnhost binary (built from k8s.io/kubernetes by
#     .ci/install) over the tools upstream's Dockerfile installs and the specs
#     exec (sh, curl, wget, nc, ip, ss, socat, bash), copied from this machine with
#     the shared libraries they load;
#   - pause: the kubelet's sandbox image, agnhost's own `pause`;
#   - busybox: Debian's static busybox with its applets;
#   - regression-issue-74839: the Conntrack spec's "boom" server, built from
#     k8s.io/kubernetes by .ci/install;
#   - coredns: CoreDNS built from source by .ci/install (test/coredns), the
#     cluster DNS (coredns.yaml);
#   - kube-proxy: kube-proxy built by .ci/install with the nft it runs
#     (nftables mode), for the cluster whose nodes start with kube-proxy as
#     a DaemonSet (daemonsets.sh).
set -euo pipefail
source "$(dirname "$0")/lib.sh"
out=${1:?usage: images.sh OUT.tar}

source "$ROOT/deploy/oci.sh"
oci_init
trap oci_done EXIT
work=$OCI_WORK

# with_libs ROOT BIN... copies each host binary into ROOT/usr/bin with every
# shared library it loads, at the same path.
with_libs() {
	local root=$1 b lib
	shift
	mkdir -p "$root/usr/bin"
	for b in "$@"; do
		cp -L "$(command -v "$b")" "$root/usr/bin/$b"
		for lib in $(ldd "$(command -v "$b")" | grep -o '/[^ ]*'); do
			mkdir -p "$root$(dirname "$lib")"
			cp -Ln "$lib" "$root$lib"
		done
	done
}

# The base every image shares: busybox's applets in /bin (curl, nc and the
# rest in /usr/bin come first on PATH), /tmp, and the files a container
# expects to exist.
mkdir -p "$work/base/bin" "$work/base/tmp" "$work/base/etc" "$work/base/root"
chmod 1777 "$work/base/tmp"
cp /bin/busybox "$work/base/bin/busybox"
for a in $(/bin/busybox --list); do
	[ -e "$work/base/bin/$a" ] || ln -s busybox "$work/base/bin/$a"
done
printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n' >"$work/base/etc/passwd"
printf 'root:x:0:\nnogroup:x:65534:\n' >"$work/base/etc/group"
echo 'hosts: files dns' >"$work/base/etc/nsswitch.conf"
base=$(oci_layer "$work/base")

mkdir -p "$work/agnhost"
cp "$BIN/agnhost" "$work/agnhost/agnhost"
agnhost=$(oci_layer "$work/agnhost")

with_libs "$work/tools" curl wget nc.openbsd ip ss socat bash
ln -s nc.openbsd "$work/tools/usr/bin/nc"
# Debian's static busybox runs its own applets before PATH: a spec's
# `sh -c "nc -v -t ..."` would get busybox's nc. Alpine's sh (upstream's base)
# follows PATH, and so does bash. (Its network applets also crash resolving
# through a static glibc's NSS: wget is Debian's.)
mkdir -p "$work/tools/bin"
ln -s /usr/bin/bash "$work/tools/bin/sh"
tools=$(oci_layer "$work/tools")

oci_image registry.k8s.io/e2e-test-images/agnhost:2.66.1 '["/agnhost"]' '["pause"]' "$base" "$tools" "$agnhost"
oci_image registry.k8s.io/pause:3.10.2 '["/agnhost","pause"]' 'null' "$agnhost"
oci_image registry.k8s.io/e2e-test-images/busybox:1.37.0-2 'null' '["sh"]' "$base"
mkdir -p "$work/boom"
cp "$BIN/regression-issue-74839" "$work/boom/regression-issue-74839"
oci_image registry.k8s.io/e2e-test-images/regression-issue-74839:1.5 '["/regression-issue-74839"]' 'null' "$base" "$(oci_layer "$work/boom")"
mkdir -p "$work/coredns"
cp "$BIN/coredns" "$work/coredns/coredns"
oci_image localhost/coredns:v1.15.0 '["/coredns"]' 'null' "$(oci_layer "$work/coredns")"

mkdir -p "$work/kube-proxy/usr/local/bin"
cp "$BIN/kube-proxy" "$work/kube-proxy/usr/local/bin/kube-proxy"
with_libs "$work/kube-proxy" nft
oci_image localhost/kube-proxy:test '["/usr/local/bin/kube-proxy"]' 'null' "$(oci_layer "$work/kube-proxy")"

oci_archive "$out"
