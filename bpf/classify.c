// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* The policy classifier: one program that judges a packet against a large
 * policy by looking it up in indexes instead of walking its rules.
 *
 * The policy module (policy/classify.go) flattens an endpoint direction's
 * tiers into one numbered list of rules and indexes each rule by one of its
 * conditions, the one the fewest other rules share: its destination port
 * (cls_ports, per protocol), its destination or its source CIDRs (LPM tries
 * per family, each CIDR's list holding the rules of every CIDR around it).
 * Rules with none of these conditions are listed apart (cls_meta.wild). A
 * rule that matches a packet is in the list of its group for the packet's
 * port or address, so walking the four lists merged in rule order, and
 * checking each rule whole, gives the verdict the rule-by-rule programs give
 * (policy/compile.go): tiers, Pass and Log included. A list longer than
 * CLS_MAX_CANDIDATES is stored as overflowing, and a packet that meets one
 * goes to the policy's rule-by-rule programs.
 *
 * Each policy gets its own copy of the cls_* maps (created by the policy
 * module and referenced by its copy of this program); the sl_* maps are the
 * datapath's pinned ones. Never part of the datapath's object. */

#include "common.h"
#include "policy.h"
#include "frag.h"
#include "conntrack6.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

#define CLS_NETS		4	/* CIDRs per address condition */
#define CLS_SETS		4	/* IP sets per address condition */
#define CLS_PORTS		4	/* port ranges per rule */
#define CLS_TIERS		64
#define CLS_MAX_CANDIDATES	64	/* a longer list is stored as CLS_OVERFLOW */
#define CLS_OVERFLOW		0xffffffff
#define CLS_OTHER_PROTOCOLS	(3 * 65536)	/* cls_ports' slot for neither TCP, UDP nor SCTP */

/* The implicit verdicts' rule ids (policy/model.go). */
#define CLS_IMPLICIT_RULE_BASE	0xffff0000
#define CLS_END_OF_POLICY	0xffffffff

enum cls_action { CLS_ALLOW, CLS_DENY, CLS_PASS, CLS_LOG };

/* cls_rule.flags: a condition is present, or negated. */
enum cls_flags {
	CLS_PROTO	= 1 << 0,
	CLS_NOT_PROTO	= 1 << 1,
	CLS_NOT_SRC_NETS = 1 << 2,
	CLS_NOT_DST_NETS = 1 << 3,
	CLS_NOT_SRC_SETS = 1 << 4,
	CLS_NOT_DST_SETS = 1 << 5,
	CLS_NOT_PORTS	= 1 << 6,
	CLS_ICMP	= 1 << 7,
	CLS_NOT_ICMP	= 1 << 8,
	CLS_ICMP_TYPE	= 1 << 9,
	CLS_ICMP_CODE	= 1 << 10,
};

struct cls_net {
	__u32 addr[4];		/* network order, masked; an IPv4 CIDR's in the first word */
	__u32 mask[4];		/* network order */
	__u32 ipv6;		/* 0 IPv4, 1 IPv6, 2 an unused slot */
};

struct cls_port_range {
	__u16 first, last;	/* host order */
};

struct cls_rule {
	__u32 id;
	__u16 flags;		/* enum cls_flags */
	__u8 action;		/* enum cls_action */
	__u8 tier;
	__u8 proto;
	__u8 icmp_type, icmp_code;
	__u8 n_ports;
	__u8 n_src_nets, n_dst_nets, n_src_sets, n_dst_sets;
	struct cls_port_range ports[CLS_PORTS];
	struct cls_net src_nets[CLS_NETS], dst_nets[CLS_NETS];
	__be32 src_sets[CLS_SETS], dst_sets[CLS_SETS];	/* set ids, network order */
};

/* A list of candidate rules: items[off, off+len), ascending. */
struct cls_list {
	__u32 off;
	__u32 len;		/* CLS_OVERFLOW: more than CLS_MAX_CANDIDATES */
};

struct cls_meta {
	__u32 tiers;
	/* next_deny[t]: the first tier from t on that ends with Deny (a tier
	 * that ends with Pass leads to the next), or CLS_TIERS if none. */
	__u8 next_deny[CLS_TIERS];
	/* The slot of the rule-by-rule programs of the same policy, for a
	 * packet one of whose lists overflows; 0 when no packet's can. */
	__u32 fallback_slot;
	/* The rules with no port or address condition to index them by. */
	struct cls_list wild;
	/* Which address tries hold rules: CLS_HAS_* bits. */
	__u32 tries;
	/* The program's name after its tables (policy/classify.go): the
	 * kernel names the program after this file's function. */
	char name[16];
};

enum cls_has {
	CLS_HAS_SRC4 = 1 << 0,
	CLS_HAS_DST4 = 1 << 1,
	CLS_HAS_SRC6 = 1 << 2,
	CLS_HAS_DST6 = 1 << 3,
};

struct cls_addr4_key {
	__u32 prefixlen;
	__u8 addr[4];
};

struct cls_addr6_key {
	__u32 prefixlen;
	__u8 addr[16];
};

/* Sizes are set by the policy module for each policy. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct cls_meta);
} cls_meta_map SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct cls_rule);
} cls_rules_map SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} cls_items SEC(".maps");

/* [protocol slot * 65536 + port]: 0 TCP, 1 UDP, 2 SCTP; CLS_OTHER_PROTOCOLS:
 * any other protocol. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, CLS_OTHER_PROTOCOLS + 1);
	__type(key, __u32);
	__type(value, struct cls_list);
} cls_ports SEC(".maps");

#define CLS_ADDR_TRIE(name, key_type)				\
	struct {						\
		__uint(type, BPF_MAP_TYPE_LPM_TRIE);		\
		__uint(max_entries, 1);				\
		__uint(map_flags, BPF_F_NO_PREALLOC);		\
		__type(key, struct key_type);			\
		__type(value, struct cls_list);			\
	} name SEC(".maps")

CLS_ADDR_TRIE(cls_src4, cls_addr4_key);
CLS_ADDR_TRIE(cls_dst4, cls_addr4_key);
CLS_ADDR_TRIE(cls_src6, cls_addr6_key);
CLS_ADDR_TRIE(cls_dst6, cls_addr6_key);

/* The candidate lists of a packet, one per group of rules: each rule is
 * indexed by one of its conditions, its group's (policy/classify.go). */
enum cls_group { CLS_BY_PORT, CLS_BY_DST, CLS_BY_SRC, CLS_WILD, CLS_GROUPS };

/* What the walk of the lists needs and finds. */
struct cls_walk {
	__u32 src[4], dst[4];
	__u32 off[CLS_GROUPS], len[CLS_GROUPS], pos[CLS_GROUPS];
	__u32 tier;		/* the tier being evaluated */
	__u32 decided;		/* 0, or POLICY_ALLOW / POLICY_DENY */
	__u32 rule;		/* the deciding rule */
	__u16 dport;		/* host order */
	__u8 proto, icmp_type, icmp_code;
	__u8 ipv6;
};

/* The rule checks compute without branches: the verifier walks a branch's
 * both ways, and a comparison per CIDR word or port range would multiply
 * its paths past its limit. zero is 1 for 0, else 0; at_least is a >= b
 * for 16-bit values. */
static __always_inline __u32 zero(__u32 x)
{
	return ((x | -x) >> 31) ^ 1;
}

static __always_inline __u32 at_least(__u32 a, __u32 b)
{
	return ((a - b) >> 31) ^ 1;
}

/* An unused slot's family (2) is no packet's. */
static __always_inline __u32 net_holds(const struct cls_net *n, const __u32 *a, __u32 ipv6)
{
	__u32 diff = ((a[0] ^ n->addr[0]) & n->mask[0]) | ((a[1] ^ n->addr[1]) & n->mask[1]) |
		     ((a[2] ^ n->addr[2]) & n->mask[2]) | ((a[3] ^ n->addr[3]) & n->mask[3]);

	return zero(diff | (n->ipv6 ^ ipv6));
}

static __always_inline __u32 nets_hold(const struct cls_net *nets, const __u32 *a, __u32 ipv6)
{
	__u32 held = 0;
	int i;

#pragma unroll
	for (i = 0; i < CLS_NETS; i++)
		held |= net_holds(&nets[i], a, ipv6);
	return held;
}

static __always_inline int in_set(__be32 set, const __u32 *a, __u8 ipv6)
{
	if (ipv6) {
		struct ipset6_key k = { .prefixlen = 32 + 128, .set_id = set };
		__builtin_memcpy(k.addr, a, 16);
		return bpf_map_lookup_elem(&sl_ipset6_v1, &k) != NULL;
	}
	struct ipset_key k = { .prefixlen = 32 + 32, .set_id = set };
	__builtin_memcpy(&k.addr, a, 4);
	return bpf_map_lookup_elem(&sl_ipset_v1, &k) != NULL;
}

static __always_inline int sets_hold(const __be32 *sets, int n, const __u32 *a, __u8 ipv6)
{
	int i;

#pragma unroll
	for (i = 0; i < CLS_SETS; i++)
		if (i < n && in_set(sets[i], a, ipv6))
			return 1;
	return 0;
}

/* cond: a condition holds — absent, or present and matching unless negated. */
static __always_inline int cond(int present, int match, int negate)
{
	return !present || (!!match != !!negate);
}

/* cls_rule_matches is a global function: the verifier checks it once, on
 * its own, rather than at each of its calls with each caller's state. */
__attribute__((noinline)) int cls_rule_matches(const struct cls_rule *r, const struct cls_walk *w)
{
	if (!r || !w)
		return 0;
	__u16 f = r->flags;

	if (!cond(f & CLS_PROTO, w->proto == r->proto, f & CLS_NOT_PROTO))
		return 0;
	if (r->n_ports) {
		/* Unused slots hold an empty range. */
		__u32 in = 0;
		int i;
#pragma unroll
		for (i = 0; i < CLS_PORTS; i++)
			in |= at_least(w->dport, r->ports[i].first) & at_least(r->ports[i].last, w->dport);
		in &= zero(w->proto ^ IPPROTO_TCP) | zero(w->proto ^ IPPROTO_UDP) | zero(w->proto ^ IPPROTO_SCTP);
		if (in == !!(f & CLS_NOT_PORTS))
			return 0;
	}
	if (f & CLS_ICMP) {
		int icmp = w->proto == (w->ipv6 ? IPPROTO_ICMPV6 : IPPROTO_ICMP) &&
			   (!(f & CLS_ICMP_TYPE) || w->icmp_type == r->icmp_type) &&
			   (!(f & CLS_ICMP_CODE) || w->icmp_code == r->icmp_code);
		if (icmp == !!(f & CLS_NOT_ICMP))
			return 0;
	}
	/* A rule's CIDRs are of either family; one of the other never holds. */
	if (r->n_src_nets && !cond(1, nets_hold(r->src_nets, w->src, w->ipv6), f & CLS_NOT_SRC_NETS))
		return 0;
	if (r->n_dst_nets && !cond(1, nets_hold(r->dst_nets, w->dst, w->ipv6), f & CLS_NOT_DST_NETS))
		return 0;
	if (r->n_src_sets && !cond(1, sets_hold(r->src_sets, r->n_src_sets, w->src, w->ipv6), f & CLS_NOT_SRC_SETS))
		return 0;
	if (r->n_dst_sets && !cond(1, sets_hold(r->dst_sets, r->n_dst_sets, w->dst, w->ipv6), f & CLS_NOT_DST_SETS))
		return 0;
	return 1;
}

/* end_tiers ends the tiers before `until` that no rule decided: the first
 * of them that ends with Deny denies (1); otherwise evaluation goes on in
 * `until` (0). */
static __always_inline int end_tiers(struct cls_walk *w, const struct cls_meta *meta, __u32 until)
{
	if (w->tier >= until)
		return 0;
	__u32 deny = meta->next_deny[w->tier & (CLS_TIERS - 1)];
	if (deny < until) {
		w->decided = POLICY_DENY;
		w->rule = CLS_IMPLICIT_RULE_BASE + deny;
		return 1;
	}
	w->tier = until;
	return 0;
}

/* next_candidate returns the lowest rule number at the head of the lists
 * and moves past it, or -1 when every list is walked. A rule is in one
 * group's list only. */
static __always_inline __s64 next_candidate(struct cls_walk *w)
{
	__u32 best = CLS_GROUPS, best_rule = 0xffffffff;
	int g;

#pragma unroll
	for (g = 0; g < CLS_GROUPS; g++) {
		if (w->pos[g] >= w->len[g])
			continue;
		__u32 k = w->off[g] + w->pos[g];
		__u32 *rule = bpf_map_lookup_elem(&cls_items, &k);
		if (!rule)
			return -1;
		if (*rule < best_rule) {
			best_rule = *rule;
			best = g;
		}
	}
	switch (best) {
	case CLS_BY_PORT:
		w->pos[CLS_BY_PORT]++;
		break;
	case CLS_BY_DST:
		w->pos[CLS_BY_DST]++;
		break;
	case CLS_BY_SRC:
		w->pos[CLS_BY_SRC]++;
		break;
	case CLS_WILD:
		w->pos[CLS_WILD]++;
		break;
	default:
		return -1;
	}
	return best_rule;
}

static long walk_one(__u32 i, void *ctx)
{
	struct cls_walk *w = ctx;
	__u32 meta_key = 0;
	(void)i;
	const struct cls_meta *meta = bpf_map_lookup_elem(&cls_meta_map, &meta_key);
	if (!meta)
		return 1;
	__s64 next = next_candidate(w);
	if (next < 0)
		return 1;
	__u32 idx = next;
	const struct cls_rule *r = bpf_map_lookup_elem(&cls_rules_map, &idx);
	if (!r)
		return 1;
	if (r->tier < w->tier)
		return 0;	/* its tier was passed */
	if (end_tiers(w, meta, r->tier))
		return 1;
	if (!cls_rule_matches(r, w))
		return 0;
	switch (r->action) {
	case CLS_ALLOW:
		w->decided = POLICY_ALLOW;
		w->rule = r->id;
		return 1;
	case CLS_DENY:
		w->decided = POLICY_DENY;
		w->rule = r->id;
		return 1;
	case CLS_PASS:
		w->tier = r->tier + 1;
		return 0;
	default:
		rule_count(r->id);
		return 0;
	}
}

static __always_inline int verdict(struct __sk_buff *skb, __u32 decision, __u32 rule)
{
	skb->cb[4] = rule;
	skb->cb[3] |= decision;
	bpf_tail_call(skb, &sl_polprog_v1, POLICY_VERDICT_SLOT);
	return decision == POLICY_ALLOW ? TC_ACT_OK : TC_ACT_SHOT;
}

/* take sets a group's list for the walk: 1 when it overflows. */
static __always_inline int take(struct cls_walk *w, enum cls_group g, const struct cls_list *l)
{
	if (!l)
		return 0;	/* no rule of the group can match */
	if (l->len == CLS_OVERFLOW)
		return 1;
	w->off[g] = l->off;
	w->len[g] = l->len;
	return 0;
}

SEC("tc")
int sl_policy_classify(struct __sk_buff *skb)
{
	__u32 zero = 0, meta3 = skb->cb[3];
	struct cls_walk w = {
		.proto = meta3 & 0xff, .icmp_type = (meta3 >> 8) & 0xff, .icmp_code = (meta3 >> 16) & 0xff,
		.ipv6 = !!(meta3 & POLICY_IPV6), .dport = bpf_ntohs(skb->cb[2] >> 16),
	};
	const struct cls_meta *meta = bpf_map_lookup_elem(&cls_meta_map, &zero);
	if (!meta)
		return TC_ACT_SHOT;
	if (w.ipv6) {
		struct ct6_scratch *sc = bpf_map_lookup_elem(&sl_scratch6_v1, &zero);
		if (!sc)
			return TC_ACT_SHOT;
		__builtin_memcpy(w.src, sc->pol.saddr, 16);
		__builtin_memcpy(w.dst, sc->pol.daddr, 16);
	} else {
		w.src[0] = skb->cb[0];
		w.dst[0] = skb->cb[1];
	}

	/* The address tries are only asked when they hold rules. */
	__u32 slot = w.proto == IPPROTO_TCP    ? w.dport
		     : w.proto == IPPROTO_UDP  ? 65536 + w.dport
		     : w.proto == IPPROTO_SCTP ? 2 * 65536 + w.dport
					       : CLS_OTHER_PROTOCOLS;
	int overflow = take(&w, CLS_BY_PORT, bpf_map_lookup_elem(&cls_ports, &slot)) |
		       take(&w, CLS_WILD, &meta->wild);
	if (w.ipv6) {
		struct cls_addr6_key k = { .prefixlen = 128 };
		if (meta->tries & CLS_HAS_SRC6) {
			__builtin_memcpy(k.addr, w.src, 16);
			overflow |= take(&w, CLS_BY_SRC, bpf_map_lookup_elem(&cls_src6, &k));
		}
		if (meta->tries & CLS_HAS_DST6) {
			__builtin_memcpy(k.addr, w.dst, 16);
			overflow |= take(&w, CLS_BY_DST, bpf_map_lookup_elem(&cls_dst6, &k));
		}
	} else {
		struct cls_addr4_key k = { .prefixlen = 32 };
		if (meta->tries & CLS_HAS_SRC4) {
			__builtin_memcpy(k.addr, w.src, 4);
			overflow |= take(&w, CLS_BY_SRC, bpf_map_lookup_elem(&cls_src4, &k));
		}
		if (meta->tries & CLS_HAS_DST4) {
			__builtin_memcpy(k.addr, w.dst, 4);
			overflow |= take(&w, CLS_BY_DST, bpf_map_lookup_elem(&cls_dst4, &k));
		}
	}
	if (overflow) {
		if (meta->fallback_slot)
			bpf_tail_call(skb, &sl_polprog_v1, meta->fallback_slot);
		return TC_ACT_SHOT;
	}
	bpf_loop(CLS_GROUPS * CLS_MAX_CANDIDATES, walk_one, &w, 0);
	if (!w.decided)
		end_tiers(&w, meta, meta->tiers);
	if (w.decided)
		return verdict(skb, w.decided, w.rule);
	return verdict(skb, POLICY_DENY, CLS_END_OF_POLICY);
}
