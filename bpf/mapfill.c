// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* Map fill without a walk: an iterator over every BPF map of the host that
 * writes each map's id and the number of entries it holds, read from the
 * kernel's own count (the hash maps' per-CPU element counter, summed by the
 * bpf_map_sum_elem_count kfunc; an LPM trie's n_entries). One pass costs a
 * few hundred nanoseconds a map, whatever their size: the agent's metrics
 * read it on every scrape (maps.Fill). Maps the kernel does not count
 * (arrays are always full) report -1. Never attached to a hook. */

#include <linux/types.h>
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>

char LICENSE[] SEC("license") = "Dual BSD/GPL";

/* The kernel's types, as much of them as is read here: CO-RE relocates each
 * field to where this kernel has it. */
struct bpf_map {
	__u32 id;
	enum bpf_map_type map_type;
} __attribute__((preserve_access_index));

struct lpm_trie {
	__u64 n_entries;
} __attribute__((preserve_access_index));

struct seq_file;

struct bpf_iter_meta {
	struct seq_file *seq;
} __attribute__((preserve_access_index));

struct bpf_iter__bpf_map {
	struct bpf_iter_meta *meta;
	struct bpf_map *map;
} __attribute__((preserve_access_index));

extern __s64 bpf_map_sum_elem_count(const struct bpf_map *map) __ksym;

/* One record a map. */
struct map_fill {
	__u32 id;		/* host order: the map's id */
	__u32 pad;		/* 0 */
	__s64 entries;		/* host order: -1 when the kernel keeps no count */
};

SEC("iter/bpf_map")
int sl_map_fill(struct bpf_iter__bpf_map *ctx)
{
	struct bpf_map *map = ctx->map;
	struct map_fill rec = {};

	if (!map)
		return 0;
	rec.id = map->id;
	switch (map->map_type) {
	case BPF_MAP_TYPE_HASH:
	case BPF_MAP_TYPE_PERCPU_HASH:
	case BPF_MAP_TYPE_LRU_HASH:
	case BPF_MAP_TYPE_LRU_PERCPU_HASH:
	case BPF_MAP_TYPE_HASH_OF_MAPS:
		rec.entries = bpf_map_sum_elem_count(map);
		break;
	case BPF_MAP_TYPE_LPM_TRIE: {
		__u64 n = 0;
		bpf_probe_read_kernel(&n, sizeof(n), &((struct lpm_trie *)map)->n_entries);
		rec.entries = n;
		break;
	}
	default:
		rec.entries = -1;
	}
	bpf_seq_write(ctx->meta->seq, &rec, sizeof(rec));
	return 0;
}
