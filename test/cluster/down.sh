#!/usr/bin/env bash
# down.sh removes everything up.sh made, even after a half-finished up.sh:
# the processes (the daemons it started, then every process left in the
# nodes' cgroups: containers and their shims), the cgroups /slc-node*, the
# nodes' mount namespaces (which take the pods' network namespaces, overlay
# and volume mounts with them), the bpffs mounts, the slc-* network
# namespaces, and $STATE and $DATA.
set -uo pipefail
source "$(dirname "$0")/lib.sh"

for f in "$STATE"/pids/*; do
	[ -e "$f" ] && stop "$(basename "$f")"
done

# Whatever still runs in a node's cgroups (containers, shims) is killed.
hierarchies=("${CGROUP_V1[@]}" systemd unified)
for _ in 1 2 3; do
	left=0
	for h in "${hierarchies[@]}"; do
		for procs in $(find /sys/fs/cgroup/"$h"/slc-node* -name cgroup.procs 2>/dev/null); do
			for pid in $(cat "$procs"); do
				kill -KILL "$pid" 2>/dev/null && left=1
			done
		done
	done
	[ $left = 0 ] && break
	sleep 1
done
for h in "${hierarchies[@]}"; do
	for d in /sys/fs/cgroup/"$h"/slc-node*; do
		[ -d "$d" ] && find "$d" -depth -type d -exec rmdir {} + 2>/dev/null
	done
done

if [ -d "$STATE" ]; then
	for m in "$STATE"/node*/mnt "$STATE"/node*/bpf; do
		mountpoint -q "$m" 2>/dev/null && umount -l "$m"
	done
	mountpoint -q "$STATE" && umount -l "$STATE"
fi
for ns in $(ip netns list | awk '/^slc-/ {print $1}'); do
	ip netns delete "$ns"
done
rm -rf "$STATE" "$DATA"

# Anything the cluster made that is still here is a bug of down.sh: say so.
leftover=$(
	ip netns list | awk '/^slc-/'
	ls -d /sys/fs/cgroup/*/slc-node* 2>/dev/null
	ls -d "$STATE" "$DATA" 2>/dev/null
)
if [ -n "$leftover" ]; then
	echo "down.sh left behind:" >&2
	echo "$leftover" >&2
	exit 1
fi
