#!/usr/bin/env bash
# image.sh OUT.tar [NAME] builds Sluice's image without a registry or a
# container daemon: the agent built static from this checkout
# (CGO_ENABLED=0, -trimpath, its version from git describe), alone in one
# layer at /usr/bin/sluice. The same commit gives the same bytes, so the
# same image digest. NAME defaults to localhost/sluice:VERSION. Import it
# with `ctr -n k8s.io images import OUT.tar`, or push it with
# `skopeo copy oci-archive:OUT.tar docker://REGISTRY/sluice:VERSION`.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
source "$root/deploy/oci.sh"
out=${1:?usage: image.sh OUT.tar [NAME]}
version=$(git -C "$root" describe --always --dirty 2>/dev/null || echo dev)
name=${2:-localhost/sluice:$version}

oci_init
trap oci_done EXIT
mkdir -p "$OCI_WORK/root/usr/bin" "$OCI_WORK/root/tmp"
chmod 1777 "$OCI_WORK/root/tmp"
(cd "$root" && CGO_ENABLED=0 go build -trimpath -buildvcs=false -ldflags "-s -w -X main.version=$version" \
	-o "$OCI_WORK/root/usr/bin/sluice" ./cmd/sluice)
touch -d @0 "$OCI_WORK/root/usr/bin/sluice"
oci_image "$name" '["/usr/bin/sluice"]' '["agent"]' "$(oci_layer "$OCI_WORK/root")"
oci_archive "$out"
echo "$name"
