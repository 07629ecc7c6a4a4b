# oci.sh: shell functions that lay out OCI images without a registry or a
# container daemon, reproducibly (sorted tar entries, zero times and owners),
# as one archive `ctr images import` and `skopeo copy oci-archive:` take.
# Sourced by deploy/image.sh and test/cluster/images.sh.
#
#   oci_init                 a work directory in $OCI_WORK (removed by oci_done)
#   oci_layer DIR            packs DIR as a layer; prints "DIGEST SIZE"
#   oci_image NAME ENTRYPOINT_JSON CMD_JSON LAYER...   adds an image
#   oci_archive OUT          writes the archive of every image added

oci_init() {
	OCI_WORK=$(mktemp -d)
	OCI_MANIFESTS=()
	mkdir -p "$OCI_WORK/oci/blobs/sha256"
	echo '{"imageLayoutVersion":"1.0.0"}' >"$OCI_WORK/oci/oci-layout"
}

oci_done() { rm -rf "$OCI_WORK"; }

# oci_blob FILE stores FILE as a blob and prints "DIGEST SIZE".
oci_blob() {
	local d s
	d=$(sha256sum "$1" | cut -d' ' -f1)
	s=$(stat -c %s "$1")
	cp "$1" "$OCI_WORK/oci/blobs/sha256/$d"
	echo "sha256:$d $s"
}

oci_layer() {
	tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -C "$1" -cf "$OCI_WORK/layer.tar" .
	oci_blob "$OCI_WORK/layer.tar"
}

oci_image() {
	local name=$1 entry=$2 cmd=$3 diff_ids="" layers="" d s l
	shift 3
	for l in "$@"; do
		read -r d s <<<"$l"
		diff_ids+="${diff_ids:+,}\"$d\""
		layers+="${layers:+,}{\"mediaType\":\"application/vnd.oci.image.layer.v1.tar\",\"digest\":\"$d\",\"size\":$s}"
	done
	printf '{"architecture":"amd64","os":"linux","config":{"Env":["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],"Entrypoint":%s,"Cmd":%s,"WorkingDir":"/"},"rootfs":{"type":"layers","diff_ids":[%s]}}' \
		"$entry" "$cmd" "$diff_ids" >"$OCI_WORK/config.json"
	read -r d s < <(oci_blob "$OCI_WORK/config.json")
	printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"%s","size":%s},"layers":[%s]}' \
		"$d" "$s" "$layers" >"$OCI_WORK/manifest.json"
	read -r d s < <(oci_blob "$OCI_WORK/manifest.json")
	OCI_MANIFESTS+=("{\"mediaType\":\"application/vnd.oci.image.manifest.v1+json\",\"digest\":\"$d\",\"size\":$s,\"platform\":{\"architecture\":\"amd64\",\"os\":\"linux\"},\"annotations\":{\"io.containerd.image.name\":\"$name\",\"org.opencontainers.image.ref.name\":\"${name##*:}\"}}")
}

oci_archive() {
	(
		IFS=,
		echo "{\"schemaVersion\":2,\"mediaType\":\"application/vnd.oci.image.index.v1+json\",\"manifests\":[${OCI_MANIFESTS[*]}]}"
	) >"$OCI_WORK/oci/index.json"
	tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -C "$OCI_WORK/oci" -cf "$1" .
}
