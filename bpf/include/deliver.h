/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Local delivery: a packet from a workload to another workload on the same
 * node is handed by the datapath to the destination's host-side interface,
 * rewritten as the node's forwarding would (the next hop's MACs, the TTL one
 * less), instead of passing through the node's IP stack. It still leaves
 * through that interface's egress hook (sl_to_wl), so the destination's
 * ingress policy judges it as before; what it skips is the stack's routing,
 * netfilter's PREROUTING, FORWARD and POSTROUTING, and the neighbour output,
 * most of a forwarded packet's cost (Calico's eBPF dataplane and Cilium's BPF
 * host routing do the same). --stack-routing (CFG_STACK_ROUTING) turns it
 * off.
 *
 * The kernel's FIB decides where a packet goes, as it does for the stack.
 * Its answer is kept in sl_route_v1 for ROUTE_TTL_NS per {destination,
 * ingress interface}, so a pod pays one FIB lookup a second per destination,
 * not one a packet (a pod's interface stands for its source addresses: the
 * FIB is asked with the first packet's). An answer that the destination is
 * not a ready workload's interface is kept too. Each delivered packet checks
 * that the destination interface is still a ready workload's
 * (sl_ifstate_v1, whose entry goes with the interface), so a pod's removal
 * is seen at once. An established flow whose destination is not a
 * workload's here (traffic to other nodes, to the node, out of the cluster)
 * is marked on its conntrack entry (CT_SEEN_STACK_ROUTED) by the first of
 * its packets that asks, and asks no more: its packets pay a bit test, not
 * a lookup (deliver_flow, datapath.h). With local delivery off (or no
 * configuration written yet) every flow is marked by its first established
 * packet: a flow begun then keeps to the stack after it is turned on.
 *
 * What the stack must handle itself passes to it: IPv4 options, a TTL (hop
 * limit) that expires here, a packet larger than the destination's MTU (the
 * stack fragments it or answers), a destination the FIB does not route
 * through a workload's interface of this node; for IPv6 also a hop-by-hop
 * header (every router reads it) and link-local or multicast destinations
 * (neighbour discovery, which is the node's own). */
#pragma once

#include "common.h"
#include "config.h"
#include "conntrack.h"
#include "counters.h"
#include "datapath.h"
#include "fib.h"
#include "ifstate.h"
#include "ipv6.h"

/* An answer of the FIB stays this long: a changed route or neighbour (a
 * pod's MAC) is followed within it. */
#define ROUTE_TTL_NS		NS_PER_SEC

struct route_key {
	__be32 daddr;		/* network order */
	__u32 ifindex;		/* host order: the interface the packet came in by */
};
ASSERT_SIZE(struct route_key, 8);

struct route_value {
	__u8 macs[12];		/* the destination's MAC, then the node side's */
	__u16 mtu;		/* host order: the destination interface's MTU */
	__u16 pad;
	__u32 ifindex;		/* host order: the destination's host-side
				 * interface; 0: the stack routes the packet */
	__u32 pad2;
	__u64 expires;		/* sl_now */
};
ASSERT_SIZE(struct route_value, 32);

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, SL_ROUTE_MAX);
	__type(key, struct route_key);
	__type(value, struct route_value);
} sl_route_v1 SEC(".maps");

struct route6_key {
	__u8 daddr[16];
	__u32 ifindex;		/* host order: the interface the packet came in by */
};
ASSERT_SIZE(struct route6_key, 20);

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, SL_ROUTE_MAX);
	__type(key, struct route6_key);
	__type(value, struct route_value);
} sl_route6_v1 SEC(".maps");

/* ready_workload: ifindex is a pod's host-side interface with every program
 * attached. */
static __always_inline int ready_workload(__u32 ifindex)
{
	struct ifstate_key k = { .ifindex = ifindex };
	struct ifstate_value *st = bpf_map_lookup_elem(&sl_ifstate_v1, &k);

	return st && (st->flags & (IFS_WORKLOAD | IFS_READY)) == (IFS_WORKLOAD | IFS_READY);
}

/* route_answer turns the FIB's answer rc for a packet that came in by
 * in_ifindex into what is kept: the destination's interface, MACs and MTU
 * when it is a ready workload's other than the one the packet came by;
 * else "the stack routes it". */
static __always_inline void route_answer(struct __sk_buff *skb, const struct bpf_fib_lookup *fib, long rc,
					 __u32 in_ifindex, struct route_value *v)
{
	__u32 mtu = 0;

	v->expires = sl_now() + ROUTE_TTL_NS;
	if (rc == BPF_FIB_LKUP_RET_SUCCESS && fib->ifindex != in_ifindex && ready_workload(fib->ifindex) &&
	    bpf_check_mtu(skb, fib->ifindex, &mtu, 0, 0) >= 0 && mtu <= 0xffff) {
		v->ifindex = fib->ifindex;
		v->mtu = mtu;
		__builtin_memcpy(v->macs, fib->dmac, ETH_ALEN);
		__builtin_memcpy(v->macs + ETH_ALEN, fib->smac, ETH_ALEN);
	}
}

/* route_learn asks the FIB where an IPv4 packet of key goes and keeps the
 * answer; it returns the destination interface, 0 for a kept answer that
 * the stack routes the packet, -1 when nothing was kept. A
 * subprogram: the lookup's 64 bytes stay off the entry program's frame. An
 * answer without the neighbour's MAC is not kept: the stack resolves it (a
 * pod's first packet from the node after a while), and the next packet asks
 * again rather than wait out an answer kept without it. An update the LRU
 * map does not take costs only the next packet a lookup. */
__subprog int route_learn(struct __sk_buff *skb, const struct route_key *key)
{
	struct bpf_fib_lookup fib = {
		.family = 2, /* AF_INET */
		.ipv4_dst = key->daddr,
		.ifindex = key->ifindex,
	};
	struct route_value v = {};

	if (bpf_skb_load_bytes(skb, ETH_HLEN + offsetof(struct iphdr, saddr), &fib.ipv4_src, 4))
		return -1;
	long rc = bpf_fib_lookup(skb, &fib, sizeof(fib), 0);

	if (rc == BPF_FIB_LKUP_RET_NO_NEIGH)
		return -1;
	route_answer(skb, &fib, rc, key->ifindex, &v);
	bpf_map_update_elem(&sl_route_v1, key, &v, BPF_ANY);
	return v.ifindex;
}

/* route6_learn is route_learn for IPv6. */
__subprog int route6_learn(struct __sk_buff *skb, const struct route6_key *key)
{
	struct bpf_fib_lookup fib = {
		.family = 10, /* AF_INET6 */
		.ifindex = key->ifindex,
	};
	struct route_value v = {};

	if (bpf_skb_load_bytes(skb, ETH_HLEN + IP6_SADDR_OFF, fib.ipv6_src, 16))
		return -1;
	__builtin_memcpy(fib.ipv6_dst, key->daddr, 16);
	long rc = bpf_fib_lookup(skb, &fib, sizeof(fib), 0);
	if (rc == BPF_FIB_LKUP_RET_NO_NEIGH)
		return -1;
	route_answer(skb, &fib, rc, key->ifindex, &v);
	bpf_map_update_elem(&sl_route6_v1, key, &v, BPF_ANY);
	return v.ifindex;
}

/* route_fits: a packet of l3_len bytes from its IP header (its L4 header
 * l4_off bytes in) fits the destination's MTU; a GSO packet leaves as
 * segments (segment_len). */
static __always_inline int route_fits(struct __sk_buff *skb, const struct route_value *r, __u32 l3_len,
				      __u32 l4_off, __u8 proto)
{
	return (skb->gso_size ? segment_len(skb, l3_len, l4_off, proto) : l3_len) <= r->mtu;
}

/* route_current: a kept answer still stands (not expired; a destination
 * interface still a ready workload's). */
static __always_inline int route_current(const struct route_value *r)
{
	return r && r->expires >= sl_now_tick() && (!r->ifindex || ready_workload(r->ifindex));
}

/* to_stack passes a packet to the stack (ROUTED_BY_STACK). answer is
 * route_learn's, or a kept answer's interface: 0, the stack routes the
 * destination, marks the packet's flow (CT_SEEN_STACK_ROUTED); -1 (nothing
 * answered: no neighbour's MAC yet) does not. flow_seen: the tcp_seen word
 * of the packet's conntrack entry, or NULL. */
static __always_inline int to_stack(__u32 *flow_seen, int answer)
{
	if (answer == 0 && flow_seen)
		__sync_fetch_and_or(flow_seen, CT_SEEN_STACK_ROUTED);
	return ROUTED_BY_STACK;
}

/* deliver_with writes a packet's first hdr_len bytes (the new MACs and the
 * start of its IP header) and sends it out of ifindex. */
static __always_inline int deliver_with(struct __sk_buff *skb, const void *hdr, __u32 hdr_len, __u32 ifindex)
{
	if (bpf_skb_store_bytes(skb, 0, hdr, hdr_len, 0))
		return ROUTED_BY_STACK;
	count(CNT_LOCAL_DELIVERED);
	return bpf_redirect(ifindex, 0);
}

/* deliver_local carries out local delivery for an IPv4 packet from a
 * workload that the pipeline passes: a redirect to the destination
 * workload's interface, or ROUTED_BY_STACK. flow_seen: the tcp_seen word of
 * the packet's conntrack entry, NULL for a packet of no established flow. A
 * subprogram, asked by the established path (deliver_flow, datapath.h) and
 * by the entry program: a flow pays its call until it is marked, and a
 * delivered packet skips the stack, which costs far more than the call. */
__subprog int deliver_local(struct __sk_buff *skb, __u32 *flow_seen)
{
	void *data = (void *)(long)skb->data, *end = (void *)(long)skb->data_end;
	struct iphdr *ip = data + ETH_HLEN;
	struct config *cfg = config_get();

	if (!cfg || (cfg->flags & CFG_STACK_ROUTING))
		return to_stack(flow_seen, 0);
	if ((void *)(ip + 1) > end || ip->ihl != 5 || ip->ttl <= 1)
		return ROUTED_BY_STACK;
	struct route_key key = { .daddr = ip->daddr, .ifindex = skb->ifindex };
	__u16 len = bpf_ntohs(ip->tot_len);
	__u8 proto = ip->protocol;
	struct route_value *r = bpf_map_lookup_elem(&sl_route_v1, &key);

	if (!route_current(r)) {
		int answer = route_learn(skb, &key);
		if (answer <= 0)
			return to_stack(flow_seen, answer);
		r = bpf_map_lookup_elem(&sl_route_v1, &key);
	}
	if (!r)
		return ROUTED_BY_STACK;
	if (!r->ifindex)
		return to_stack(flow_seen, 0);
	if (!route_fits(skb, r, len, sizeof(*ip), proto))
		return ROUTED_BY_STACK;

	/* The MACs and the IP header through its checksum, in one store. */
	struct {
		__u8 macs[12];
		__be16 proto;
		struct iphdr ip;
	} __attribute__((packed)) hdr;
	const __u32 hdr_len = offsetof(typeof(hdr), ip.saddr);
	data = (void *)(long)skb->data;
	end = (void *)(long)skb->data_end;
	if (data + hdr_len > end)
		return ROUTED_BY_STACK;
	__builtin_memcpy(hdr.macs, r->macs, sizeof(hdr.macs));
	__builtin_memcpy(&hdr.proto, data + 12, hdr_len - sizeof(hdr.macs));
	/* The TTL is the high byte of its 16-bit word: one less there is
	 * 0x0100 more in the checksum, with the end-around carry (RFC 1624). */
	__u32 check = (__u32)hdr.ip.check + bpf_htons(0x0100);
	hdr.ip.check = (__sum16)(check + (check >= 0xffff));
	hdr.ip.ttl--;
	return deliver_with(skb, &hdr, hdr_len, r->ifindex);
}

/* deliver_local6 is deliver_local for IPv6: the hop limit goes down by one
 * (no header checksum). */
__subprog int deliver_local6(struct __sk_buff *skb, __u32 *flow_seen)
{
	void *data = (void *)(long)skb->data, *end = (void *)(long)skb->data_end;
	struct ip6_raw *ip = data + ETH_HLEN;
	struct config *cfg = config_get();

	if (!cfg || (cfg->flags & CFG_STACK_ROUTING))
		return to_stack(flow_seen, 0);
	if ((void *)(ip + 1) > end || ip->hop_limit <= 1 || ip->nexthdr == 0 /* hop-by-hop */ ||
	    ip->daddr[0] == 0xff || (ip->daddr[0] == 0xfe && (ip->daddr[1] & 0xc0) == 0x80))
		return ROUTED_BY_STACK;
	struct route6_key key = { .ifindex = skb->ifindex };
	__builtin_memcpy(key.daddr, ip->daddr, 16);
	__u32 len = IPV6_HLEN + bpf_ntohs(ip->payload_len);
	__u8 proto = ip->nexthdr;
	struct route_value *r = bpf_map_lookup_elem(&sl_route6_v1, &key);

	if (!route_current(r)) {
		int answer = route6_learn(skb, &key);
		if (answer <= 0)
			return to_stack(flow_seen, answer);
		r = bpf_map_lookup_elem(&sl_route6_v1, &key);
	}
	if (!r)
		return ROUTED_BY_STACK;
	if (!r->ifindex)
		return to_stack(flow_seen, 0);
	if (!route_fits(skb, r, len, IPV6_HLEN, proto))
		return ROUTED_BY_STACK;

	/* The MACs and the IPv6 header up to the source address, in one store. */
	struct {
		__u8 macs[12];
		__be16 proto;
		struct ip6_raw ip;
	} __attribute__((packed)) hdr;
	const __u32 hdr_len = offsetof(typeof(hdr), ip.saddr);
	data = (void *)(long)skb->data;
	end = (void *)(long)skb->data_end;
	if (data + hdr_len > end)
		return ROUTED_BY_STACK;
	__builtin_memcpy(hdr.macs, r->macs, sizeof(hdr.macs));
	__builtin_memcpy(&hdr.proto, data + 12, hdr_len - sizeof(hdr.macs));
	hdr.ip.hop_limit--;
	return deliver_with(skb, &hdr, hdr_len, r->ifindex);
}
