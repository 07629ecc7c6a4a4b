// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* The new-flow floor of another conntrack structure: an open-addressing table
 * in a plain array map. The verifier inlines an array lookup (no helper
 * call); a slot is claimed with one compare-and-swap and written with direct
 * stores into one cache line, where the kernel hash (floor.c's floor_ct,
 * sl_ct_v2's type) takes a bucket lock, pops a free element and copies into
 * it, across two or three lines. BenchmarkNewFlowFloor runs both in one
 * run, so the structures' costs compare as ratios.
 *
 * A measurement, not a conntrack: nothing is ever deleted (no tombstones, so
 * probing may stop at the first empty slot), and the clash rules, the
 * scanner and restart adoption are not built on it. Never attached by the
 * agent. */

#include "common.h"
#include "conntrack.h"
#include "parse.h"
#include "table_hash.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

/* Twice the conntrack map's entries, as linear probing needs the room: a
 * table for SL_CT_MAX flows at half load. 64 MiB of 64-byte slots, about
 * the memory of floor_ct (524,288 preallocated 120-byte elements and 16-byte
 * buckets: 68 MiB). A build may set it smaller (-DTABLE_SLOTS=32768, a
 * power of 2) to measure a table the cache holds. */
#ifndef TABLE_SLOTS
#define TABLE_SLOTS (2 * SL_CT_MAX)
#endif
/* A key's slots are tried in order up to this many; at the benchmark's
 * load (at most 200,000 entries, 19%) a run of this length does not occur. */
#define TABLE_PROBES 32

enum table_state : __u32 {
	TABLE_EMPTY = 0,
	TABLE_CLAIMED = 1,	/* a CPU is writing the slot */
	TABLE_LIVE = 2,
};

/* One cache line: the key and 40 bytes of value, the first 40 of struct
 * ct_value here (a conntrack entry would have to fit in them: 56 bytes do
 * not, with the key and the slot's state). */
#define TABLE_VALUE_BYTES 40
struct table_slot {
	enum table_state state;
	__u32 hash;
	struct ct_key key;
	__u8 value[TABLE_VALUE_BYTES];
};
ASSERT_SIZE(struct table_slot, 64);

/* Mmapable, so that the benchmark empties it by writing its memory (a MiB
 * a write), not with a syscall per slot. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(map_flags, BPF_F_MMAPABLE);
	__uint(max_entries, TABLE_SLOTS);
	__type(key, __u32);
	__type(value, struct table_slot);
} table_floor_slots SEC(".maps");

static __always_inline int table_key_equal(const struct table_slot *s, const struct ct_key *k, __u32 hash)
{
	return s->hash == hash && s->key.saddr == k->saddr && s->key.daddr == k->daddr &&
	       s->key.sport == k->sport && s->key.dport == k->dport && s->key.proto == k->proto;
}

/* table_find: the live slot holding k, or NULL. */
static __always_inline struct table_slot *table_find(const struct ct_key *k, __u32 hash)
{
	for (__u32 i = 0; i < TABLE_PROBES; i++) {
		__u32 idx = (hash + i) & (TABLE_SLOTS - 1);
		struct table_slot *s = bpf_map_lookup_elem(&table_floor_slots, &idx);

		if (!s || s->state == TABLE_EMPTY)
			return NULL;
		if (s->state == TABLE_LIVE && table_key_equal(s, k, hash))
			return s;
	}
	return NULL;
}

/* table_insert claims the first empty slot of k's run and writes k and v
 * into it: -EEXIST when k is live in the run, -E2BIG when the run is full.
 * A slot another CPU is still writing is passed over, so two CPUs inserting
 * one key at once could both succeed: a conntrack (whose clash rules need
 * one winner) would wait for that slot's key instead. */
static __always_inline int table_insert(const struct ct_key *k, const struct ct_value *v)
{
	__u32 hash = table_hash(k);

	for (__u32 i = 0; i < TABLE_PROBES; i++) {
		__u32 idx = (hash + i) & (TABLE_SLOTS - 1);
		struct table_slot *s = bpf_map_lookup_elem(&table_floor_slots, &idx);

		if (!s)
			return -E2BIG;
		if (s->state == TABLE_LIVE && table_key_equal(s, k, hash))
			return -EEXIST;
		if (s->state != TABLE_EMPTY ||
		    __sync_val_compare_and_swap(&s->state, TABLE_EMPTY, TABLE_CLAIMED) != TABLE_EMPTY)
			continue;
		s->hash = hash;
		s->key = *k;
		__builtin_memcpy(s->value, v, TABLE_VALUE_BYTES);
		__sync_lock_test_and_set(&s->state, TABLE_LIVE);
		return 0;
	}
	return -E2BIG;
}

/* table_write is floor.c's floor_write (with the clock) on the table. */
static __always_inline int table_write(struct __sk_buff *skb, int pair)
{
	struct packet p;
	struct ct_key key;
	struct ct_value v = {};

	if (parse_packet(skb, &p, ETH_HLEN) != PARSE_OK)
		return TC_ACT_OK;
	ct_key_of(&p, &key);
	if (table_find(&key, table_hash(&key)))
		return TC_ACT_OK;
	v.created = v.last_seen = sl_now();
	if (table_insert(&key, &v))
		return TC_ACT_SHOT;
	if (pair) {
		struct ct_key rk = {
			.saddr = p.daddr, .daddr = p.saddr, .sport = p.dport, .dport = p.sport, .proto = p.proto,
		};
		if (table_insert(&rk, &v))
			return TC_ACT_SHOT;
	}
	return TC_ACT_OK;
}

SEC("tc")
int table_floor_write_one(struct __sk_buff *skb) { return table_write(skb, 0); }

SEC("tc")
int table_floor_write_pair(struct __sk_buff *skb) { return table_write(skb, 1); }
