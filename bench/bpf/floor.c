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

/* The IPv6 floor: the IPv6 parser (extension-header walk included) and one
 * hash lookup by the 40-byte tuple. */
#include "ipv6.h"

struct floor6_key {
	__u8 saddr[16];
	__u8 daddr[16];
	__be16 sport;
	__be16 dport;
	__u8 proto;
	__u8 pad[3];
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1024);
	__type(key, struct floor6_key);
	__type(value, __u64);
} floor_flows6 SEC(".maps");

SEC("tc")
int floor_parse_lookup6(struct __sk_buff *skb)
{
	struct packet6 p6;
	struct floor6_key key = {};

	if (parse_packet6(skb, &p6, ETH_HLEN) != PARSE_OK)
		return TC_ACT_OK;
	addr6_copy(key.saddr, p6.saddr);
	addr6_copy(key.daddr, p6.daddr);
	key.sport = p6.p.sport;
	key.dport = p6.p.dport;
	key.proto = p6.p.proto;
	__u64 *hits = bpf_map_lookup_elem(&floor_flows6, &key);
	if (hits)
		return TC_ACT_OK;
	return TC_ACT_UNSPEC;
}

/* The new-flow floor series: what writing a flow's conntrack entries costs
 * alone. floor_ct has the conntrack map's type and entry sizes; the series
 * adds one write, then two (a flow's pair), then the clock read every entry
 * carries (the datapath's, sl_now), so a benchmark can tell the datapath's
 * new-flow cost from what the kernel's map writes cost. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, SL_CT_MAX);
	__type(key, struct ct_key);
	__type(value, struct ct_value);
} floor_ct SEC(".maps");

static __always_inline int floor_write(struct __sk_buff *skb, int pair, int clock)
{
	struct packet p;
	struct ct_key key;
	struct ct_value v = {};

	if (parse_packet(skb, &p, ETH_HLEN) != PARSE_OK)
		return TC_ACT_OK;
	ct_key_of(&p, &key);
	if (bpf_map_lookup_elem(&floor_ct, &key))
		return TC_ACT_OK;
	if (clock)
		v.created = v.last_seen = sl_now();
	if (bpf_map_update_elem(&floor_ct, &key, &v, BPF_NOEXIST))
		return TC_ACT_SHOT;
	if (pair) {
		struct ct_key rk = {
			.saddr = p.daddr, .daddr = p.saddr, .sport = p.dport, .dport = p.sport, .proto = p.proto,
		};
		if (bpf_map_update_elem(&floor_ct, &rk, &v, BPF_NOEXIST))
			return TC_ACT_SHOT;
	}
	return TC_ACT_OK;
}

SEC("tc")
int floor_write_one(struct __sk_buff *skb) { return floor_write(skb, 0, 0); }

SEC("tc")
int floor_write_pair(struct __sk_buff *skb) { return floor_write(skb, 1, 0); }

SEC("tc")
int floor_write_pair_clock(struct __sk_buff *skb) { return floor_write(skb, 1, 1); }
