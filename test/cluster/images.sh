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
#     cluster DNS (coredns.yaml).
set -euo pipefail
source "$(dirname "$0")/lib.sh"
out=${1:?usage: images.sh OUT.tar}

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/oci/blobs/sha256"
echo '{"imageLayoutVersion":"1.0.0"}' >"$work/oci/oci-layout"

# blob FILE stores FILE as a blob and prints "DIGEST SIZE".
blob() {
	local d s
	d=$(sha256sum "$1" | cut -d' ' -f1)
	s=$(stat -c %s "$1")
	cp "$1" "$work/oci/blobs/sha256/$d"
	echo "sha256:$d $s"
}

# layer DIR packs DIR reproducibly as an uncompressed layer; prints "DIGEST SIZE".
layer() {
	tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -C "$1" -cf "$work/layer.tar" .
	blob "$work/layer.tar"
}

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

manifests=()
# image NAME ENTRYPOINT_JSON CMD_JSON LAYER... writes the config and manifest.
image() {
	local name=$1 entry=$2 cmd=$3 diff_ids="" layers="" d s cfg man
	shift 3
	for l in "$@"; do
		read -r d s <<<"$l"
		diff_ids+="${diff_ids:+,}\"$d\""
		layers+="${layers:+,}{\"mediaType\":\"application/vnd.oci.image.layer.v1.tar\",\"digest\":\"$d\",\"size\":$s}"
	done
	printf '{"architecture":"amd64","os":"linux","config":{"Env":["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],"Entrypoint":%s,"Cmd":%s,"WorkingDir":"/"},"rootfs":{"type":"layers","diff_ids":[%s]}}' \
		"$entry" "$cmd" "$diff_ids" >"$work/config.json"
	read -r d s < <(blob "$work/config.json")
	printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"%s","size":%s},"layers":[%s]}' \
		"$d" "$s" "$layers" >"$work/manifest.json"
	read -r d s < <(blob "$work/manifest.json")
	manifests+=("{\"mediaType\":\"application/vnd.oci.image.manifest.v1+json\",\"digest\":\"$d\",\"size\":$s,\"platform\":{\"architecture\":\"amd64\",\"os\":\"linux\"},\"annotations\":{\"io.containerd.image.name\":\"$name\",\"org.opencontainers.image.ref.name\":\"${name##*:}\"}}")
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
base=$(layer "$work/base")

mkdir -p "$work/agnhost"
cp "$BIN/agnhost" "$work/agnhost/agnhost"
agnhost=$(layer "$work/agnhost")

with_libs "$work/tools" curl wget nc.openbsd ip ss socat bash
ln -s nc.openbsd "$work/tools/usr/bin/nc"
# Debian's static busybox runs its own applets before PATH: a spec's
# `sh -c "nc -v -t ..."` would get busybox's nc. Alpine's sh (upstream's base)
# follows PATH, and so does bash. (Its network applets also crash resolving
# through a static glibc's NSS: wget is Debian's.)
mkdir -p "$work/tools/bin"
ln -s /usr/bin/bash "$work/tools/bin/sh"
tools=$(layer "$work/tools")

image registry.k8s.io/e2e-test-images/agnhost:2.66.1 '["/agnhost"]' '["pause"]' "$base" "$tools" "$agnhost"
image registry.k8s.io/pause:3.10.2 '["/agnhost","pause"]' 'null' "$agnhost"
image registry.k8s.io/e2e-test-images/busybox:1.37.0-2 'null' '["sh"]' "$base"
mkdir -p "$work/boom"
cp "$BIN/regression-issue-74839" "$work/boom/regression-issue-74839"
image registry.k8s.io/e2e-test-images/regression-issue-74839:1.5 '["/regression-issue-74839"]' 'null' "$base" "$(layer "$work/boom")"
mkdir -p "$work/coredns"
cp "$BIN/coredns" "$work/coredns/coredns"
image localhost/coredns:v1.15.0 '["/coredns"]' 'null' "$(layer "$work/coredns")"

(
	IFS=,
	echo "{\"schemaVersion\":2,\"mediaType\":\"application/vnd.oci.image.index.v1+json\",\"manifests\":[${manifests[*]}]}"
) >"$work/oci/index.json"
tar -C "$work/oci" -cf "$out" .
