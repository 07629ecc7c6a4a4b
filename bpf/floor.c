// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* The benchmark floor: the least any datapath program must do per packet, parse
 * the headers and look the flow up in one hash map. Benchmarks report Sluice's
 * programs as a ratio to it. Never attached by the agent. */

#include "common.h"
#include "conntrack.h"
#include "parse.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1024);	/* the benchmark's few flows; the size does not change a lookup's cost */
	__type(key, struct ct_key);
	__type(value, __u64);
} floor_flows SEC(".maps");

SEC("tc")
int floor_parse_lookup(struct __sk_buff *skb)
{
	struct packet p;
	struct ct_key key;

	if (parse_packet(skb, &p, ETH_HLEN) != PARSE_OK)
		return TC_ACT_OK;
	ct_key_of(&p, &key);
	__u64 *hits = bpf_map_lookup_elem(&floor_flows, &key);
	if (hits)
		return TC_ACT_OK;
	return TC_ACT_UNSPEC;
}

/* The XDP floor: an empty program. */
SEC("xdp")
int floor_xdp_pass(struct xdp_md *ctx)
{
	(void)ctx;
	return XDP_PASS;
}
