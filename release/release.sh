#!/usr/bin/env bash
# release.sh releases Sluice's modules in lockstep, as OpenTelemetry-Go's
# multimod does: one version, in VERSION, for every module the workspace
# (go.work) lists; each requires the others at that version (and keeps a
# replace directive to its sibling directory, which Go ignores in a
# dependency, so the repository builds alone too).
#
#   release.sh check          every module requires its siblings at VERSION,
#                             and every tag of VERSION that exists is on a
#                             commit whose VERSION says so
#   release.sh tag VERSION    sets VERSION and the requires, commits, and
#                             tags each module DIR/VERSION (push with
#                             git push origin --tags)
#   release.sh proxy DIR      writes a file module proxy serving the working
#                             tree's modules at VERSION (modproxy)
#   release.sh examples       runs every examples/*/ module's tests with
#                             GOWORK=off against that proxy: only the
#                             modules' public surface, resolved as from tags
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
prefix=github.com/sluice-net/sluice/

# modules prints the directories of the released modules.
modules() { go work edit -json | jq -r '.Use[].DiskPath' | sed 's|^\./||'; }

# requires DIR prints "PATH VERSION" for each of DIR's requires of a sibling.
requires() { (cd "$1" && go mod edit -json) | jq -r --arg p "$prefix" '.Require[]? | select(.Path | startswith($p)) | "\(.Path) \(.Version)"'; }

check() {
	local version bad=0 dir path v tag
	version=$(cat VERSION)
	for dir in $(modules); do
		while read -r path v; do
			[ -n "$path" ] || continue
			if [ "$v" != "$version" ]; then
				echo "$dir/go.mod requires $path $v, not VERSION's $version (release.sh tag $version sets it)" >&2
				bad=1
			fi
		done < <(requires "$dir")
		tag=$dir/$version
		if git rev-parse -q --verify "refs/tags/$tag" >/dev/null; then
			if [ "$(git show "$tag:VERSION" 2>/dev/null)" != "$version" ]; then
				echo "tag $tag is on a commit whose VERSION is not $version" >&2
				bad=1
			fi
		fi
	done
	return $bad
}

set_version() {
	local version=$1 dir path v
	echo "$version" >VERSION
	for dir in $(modules); do
		while read -r path v; do
			[ -n "$path" ] && (cd "$dir" && go mod edit -require "$path@$version")
		done < <(requires "$dir")
	done
}

proxy() {
	local out=$1 dirs=()
	for dir in $(modules); do
		dirs+=("$root/$dir")
	done
	(cd release/modproxy && GOWORK=off go run . -version "$(cat "$root/VERSION")" -out "$out" "${dirs[@]}")
}

# forget_served removes this repository's modules from the module cache
# (they are read-only there), and nothing else.
forget_served() {
	local cache
	cache=$(go env GOMODCACHE)
	for d in "$cache/${prefix%/}" "$cache/cache/download/${prefix%/}"; do
		[ -d "$d" ] && chmod -R u+w "$d" && rm -rf "$d"
	done
	return 0
}

examples() {
	local work rc=0 ex
	work=$(mktemp -d)
	trap 'rm -rf "$work"' RETURN
	proxy "$work/proxy"
	for ex in examples/*/; do
		[ -f "$ex/go.mod" ] || continue
		echo "== $ex, GOWORK=off, the modules from the proxy"
		cp -r "$ex" "$work/ex"
		# The modules served here change with every commit under one
		# version: the module cache, and the go command's index of it
		# (GODEBUG=goindex=0), must not answer for them from an earlier
		# run; their sums are added here, never committed (nor checked
		# against the public checksum database).
		forget_served
		(cd "$work/ex" && GODEBUG=goindex=0 GOWORK=off GONOSUMDB="${prefix%/}" GOFLAGS=-mod=mod GOPROXY="file://$work/proxy,$(go env GOPROXY)" \
			go test -count=1 -v -bench . -benchtime 1x ./... 2>&1) >"$work/log" || rc=1
		grep -E '^(--- |ok|FAIL|panic|Benchmark)' "$work/log" || true
		[ $rc = 0 ] || tail -40 "$work/log"
		rm -rf "$work/ex"
	done
	forget_served
	return $rc
}

case ${1:-} in
check) check ;;
tag)
	version=${2:?usage: release.sh tag VERSION}
	[ -z "$(git status --porcelain)" ] || {
		echo "the work tree has changes: commit them first" >&2
		exit 1
	}
	set_version "$version"
	git commit -qam "release $version"
	for dir in $(modules); do
		git tag "$dir/$version"
	done
	check
	echo "tagged $(modules | wc -l) modules $version"
	;;
set) set_version "${2:?usage: release.sh set VERSION}" ;;
proxy) proxy "${2:?usage: release.sh proxy DIR}" ;;
examples) examples ;;
*)
	echo "usage: release.sh check | tag VERSION | set VERSION | proxy DIR | examples" >&2
	exit 2
	;;
esac
