/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* The service datapath: parse -> conntrack -> service lookup -> NAT -> verdict.
 *
 * One pipeline serves the four TC hooks; the hook says where a packet is:
 *   HOOK_FROM_WL    ingress of a workload's host-side veth (leaving the pod)
 *   HOOK_TO_WL      egress of a workload's host-side veth (entering the pod)
 *   HOOK_FROM_HOST  ingress of a data interface (from outside the node)
 *   HOOK_TO_HOST    egress of a data interface (leaving the node)
 * New flows are balanced only where they enter (FROM_*); every hook applies
 * conntrack, so both directions of a flow are handled from conntrack alone.
 *
 * Policy (policy.h): a workload's egress policy judges a new flow at
 * FROM_WL once its backend is chosen and NAT applied; its ingress policy at
 * TO_WL. The verdict is recorded on the flow's conntrack entries, so
 * established flows and replies are never judged again. */
#pragma once

#include "common.h"
#include "config.h"
#include "conntrack.h"
#include "counters.h"
#include "icmp_error.h"
#include "ifstate.h"
#include "nat.h"
#include "parse.h"
#include "policy.h"
#include "reject.h"
#include "rewrite.h"

enum hook {
	HOOK_FROM_WL,
	HOOK_TO_WL,
	HOOK_FROM_HOST,
	HOOK_TO_HOST,
};

static __always_inline int drop(enum counter c)
{
	count(c);
	return TC_ACT_SHOT;
}

static __always_inline int ct_apply(struct __sk_buff *skb, struct packet *p, const struct ct_value *v)
{
	if (v->type == CT_FORWARD) {
		if (rewrite_dst(skb, p, v->nat_addr, v->nat_port))
			return -1;
		if (v->flags & CT_SNAT)
			return rewrite_src(skb, p, v->snat_addr, v->snat_port);
		return 0;
	}
	if (rewrite_src(skb, p, v->nat_addr, v->nat_port))
		return -1;
	if (v->flags & CT_SNAT)
		return rewrite_dst(skb, p, v->snat_addr, v->snat_port);
	return 0;
}

__subprog int reject(struct __sk_buff *skb, const struct packet *p)
{
	int err = p->proto == IPPROTO_TCP ? reject_tcp(skb, p) : reject_udp(skb, p);

	if (err)
		return drop(CNT_DROP_REJECT_FAILED);
	count(CNT_REJECT_NO_ENDPOINTS);
	return bpf_redirect(skb->ifindex, 0);
}

static __always_inline __be16 random_snat_port(const struct config *cfg)
{
	__u16 lo = cfg->snat_port_min ? cfg->snat_port_min : SNAT_PORT_MIN_DEFAULT;
	__u16 hi = cfg->snat_port_max ? cfg->snat_port_max : SNAT_PORT_MAX_DEFAULT;

	if (hi < lo)
		hi = lo;
	return bpf_htons(lo + bpf_get_prandom_u32() % (hi - lo + 1));
}

/* policy_slot returns the interface's policy slot for a direction, or
 * IFSTATE_NO_POLICY. */
static __always_inline __u32 policy_slot(struct __sk_buff *skb, __u32 dir)
{
	struct ifstate_key k = { .ifindex = skb->ifindex };
	struct ifstate_value *v = bpf_map_lookup_elem(&sl_ifstate_v1, &k);

	if (!v)
		return IFSTATE_NO_POLICY;
	return dir == POLICY_DIR_EGRESS ? v->egress_policy : v->ingress_policy;
}

/* enforce applies the verdict recorded on a flow's entry for one direction;
 * an unjudged flow goes to the interface's policy program, or is recorded as
 * allowed when the interface has none. */
__subprog int enforce(struct __sk_buff *skb, const struct packet *p, struct ct_value *v, __u32 dir)
{
	enum pol_verdict pv = dir == POLICY_DIR_EGRESS ? v->pol_egress : v->pol_ingress;

	if (pv == POL_ALLOWED)
		return TC_ACT_OK;
	if (pv == POL_DENIED)
		return drop(CNT_DROP_POLICY);
	__u32 slot = policy_slot(skb, dir);
	if (slot == IFSTATE_NO_POLICY) {
		if (dir == POLICY_DIR_EGRESS)
			v->pol_egress = POL_ALLOWED;
		else
			v->pol_ingress = POL_ALLOWED;
		return TC_ACT_OK;
	}
	return policy_handoff(skb, p, dir, slot);
}

/* judge_stateless hands a packet without conntrack to the policy program, if
 * the interface has one. */
static __always_inline int judge_stateless(struct __sk_buff *skb, const struct packet *p, __u32 dir)
{
	__u32 slot = policy_slot(skb, dir);

	if (slot == IFSTATE_NO_POLICY)
		return TC_ACT_OK;
	return policy_handoff(skb, p, dir, slot);
}

/* reverse_taken tells whether the reverse key of a new flow to be belongs to
 * another live flow. A client port reused toward another Service with the
 * same backend makes the same reverse tuple: the backend would see one
 * connection where there are two, and one flow's replies would reach the
 * other. A reverse entry may be taken over when it is this flow's own (its
 * forward entry was evicted), when its forward entry is gone, or when its TCP
 * flow has closed (FINs both ways, or a reset): the usual case of a client
 * reusing a port it holds in TIME_WAIT, which netfilter lets reuse too. */
static __always_inline int reverse_taken(const struct packet *p, const struct be_value *be)
{
	struct ct_key rk = {
		.saddr = be->addr, .daddr = p->saddr, .sport = be->port, .dport = p->sport, .proto = p->proto,
	};
	struct ct_value *r = bpf_map_lookup_elem(&sl_ct_v1, &rk);

	if (!r)
		return 0;
	if (r->type != CT_REVERSE)
		return 1; /* the backend's own flow to the client's address and port */
	if (r->peer.saddr == p->saddr && r->peer.daddr == p->daddr &&
	    r->peer.sport == p->sport && r->peer.dport == p->dport)
		return 0;
	struct ct_key peer = r->peer;
	struct ct_value *f = bpf_map_lookup_elem(&sl_ct_v1, &peer);
	if (!f)
		return 0;
	if (p->proto == IPPROTO_TCP) {
		__u32 seen = f->tcp_seen | r->tcp_seen;
		if ((seen & TCP_FLAG_RST) || ((f->tcp_seen & TCP_FLAG_FIN) && (r->tcp_seen & TCP_FLAG_FIN)))
			return 0;
	}
	return 1;
}

/* ct_create writes the reverse entry, then the forward one, and sets *sport to
 * the source port the flow leaves with. With *snat_addr set the source is
 * translated: the client's port is kept when free, else random ones are
 * tried. Without, the reverse tuple is the client's own; when another live
 * flow holds it (reverse_taken, checked only when the tuple is taken) the flow
 * keeps the client's address but gets another port, as netfilter's NAT does,
 * and *snat_addr and *flags say so. It returns -1 when no entry could be
 * written. */
static __always_inline int ct_create(const struct packet *p, __u32 svc_id,
				     const struct be_value *be, __be32 *snat_addr,
				     const struct config *cfg, __u8 *flags, enum pol_verdict egress,
				     __be16 *sport)
{
	__u64 now = bpf_ktime_get_ns();
	struct ct_key fwd_key, rev_key = {
		.saddr = be->addr, .daddr = *snat_addr ? *snat_addr : p->saddr,
		.sport = be->port, .dport = p->sport, .proto = p->proto,
	};
	struct ct_value rev = {
		.created = now, .last_seen = now,
		.nat_addr = p->daddr, .nat_port = p->dport,
		.snat_addr = p->saddr, .snat_port = p->sport,
		.svc_id = svc_id, .type = CT_REVERSE, .flags = *flags, .pol_egress = egress,
	};

	ct_key_of(p, &fwd_key);
	rev.peer = fwd_key;
	if (!*snat_addr && bpf_map_update_elem(&sl_ct_v1, &rev_key, &rev, BPF_NOEXIST)) {
		if (cfg && reverse_taken(p, be)) {
			*snat_addr = p->saddr;
			*flags |= CT_SNAT;
			rev.flags = *flags;
		} else if (bpf_map_update_elem(&sl_ct_v1, &rev_key, &rev, BPF_ANY)) {
			return -1;
		}
	}
	if (*snat_addr) {
		/* The reverse key must be unique or replies would reach the wrong
		 * client: keep the client's port when free, else try random ones. */
		int i;
		for (i = 0; i < SNAT_PORT_TRIES; i++) {
			if (!bpf_map_update_elem(&sl_ct_v1, &rev_key, &rev, BPF_NOEXIST))
				break;
			rev_key.dport = random_snat_port(cfg);
		}
		if (i == SNAT_PORT_TRIES)
			return -1;
	}

	struct ct_value fwd = {
		.created = now, .last_seen = now, .peer = rev_key,
		.nat_addr = be->addr, .nat_port = be->port,
		.snat_addr = *snat_addr, .snat_port = rev_key.dport,
		.svc_id = svc_id, .tcp_seen = p->tcp_flags & (TCP_FLAG_SYN | TCP_FLAG_ACK),
		.type = CT_FORWARD, .flags = *flags, .pol_egress = egress,
	};
	if (bpf_map_update_elem(&sl_ct_v1, &fwd_key, &fwd, BPF_ANY)) {
		bpf_map_delete_elem(&sl_ct_v1, &rev_key);
		return -1;
	}
	*sport = rev_key.dport;
	return 0;
}

/* identity_flow tracks a flow that is not NATed, so that a policy's verdict
 * on its first packet holds for the rest of it. */
static __always_inline int identity_flow(struct __sk_buff *skb, struct packet *p, __u32 dir)
{
	__u32 slot = policy_slot(skb, dir);
	struct be_value self = { .addr = p->daddr, .port = p->dport };
	__be32 no_snat = 0; /* without a config ct_create never remaps */
	__u8 flags = 0;
	__be16 sport;

	if (slot == IFSTATE_NO_POLICY)
		return TC_ACT_OK;
	if (ct_create(p, 0, &self, &no_snat, NULL, &flags, dir == POLICY_DIR_EGRESS ? POL_UNJUDGED : POL_ALLOWED, &sport))
		return drop(CNT_DROP_CT_CREATE);
	return policy_handoff(skb, p, dir, slot);
}

/* to_workload_new: a packet entering a workload that matched no conntrack
 * entry by its own tuple. By the reversed tuple it may be the forward
 * direction of a flow NATed on this node (its reverse entry), or a reply to a
 * flow the workload started after reverse NAT (a forward entry). Otherwise it
 * starts a flow the ingress policy judges. */
__subprog int to_workload_new(struct __sk_buff *skb, struct packet *p)
{
	struct ct_key rk = {
		.saddr = p->daddr, .daddr = p->saddr, .sport = p->dport, .dport = p->sport, .proto = p->proto,
	};
	struct ct_value *r = bpf_map_lookup_elem(&sl_ct_v1, &rk);

	if (r)
		return r->type == CT_FORWARD ? TC_ACT_OK : enforce(skb, p, r, POLICY_DIR_INGRESS);
	return identity_flow(skb, p, POLICY_DIR_INGRESS);
}

__subprog int new_flow(struct __sk_buff *skb, struct packet *p, enum hook hook)
{
	struct fe_value *fe = fe_lookup(p->daddr, p->dport, p->proto);
	int from_host = hook == HOOK_FROM_HOST;
	struct be_value be;
	__u32 ordinal;

	if (!fe)
		return hook == HOOK_FROM_WL ? identity_flow(skb, p, POLICY_DIR_EGRESS) : TC_ACT_OK;
	if (!src_allowed(fe, p->saddr))
		return drop(CNT_DROP_SRC_RANGE);

	int local_only = (fe->flags & FE_INT_LOCAL) || (from_host && (fe->flags & FE_EXT_LOCAL));
	switch (pick_backend(fe, p->saddr, local_only, &be, &ordinal)) {
	case PICK_NO_ENDPOINTS:
		return reject(skb, p);
	case PICK_NO_LOCAL:
		return drop(CNT_DROP_NO_LOCAL_BACKEND);
	case PICK_BACKEND_MISSING:
		return drop(CNT_DROP_BACKEND_MISSING);
	}

	/* SNAT only where the reply would otherwise not come back through this
	 * node: external traffic forwarded to another node, and a pod reaching
	 * itself through its Service (hairpin); and where the operator asks:
	 * --masquerade-all, or --cluster-cidr for ClusterIP traffic from outside
	 * the cluster. Everything else keeps the client's address. */
	struct config *cfg = config_get();
	__be32 snat_addr = 0;
	__u8 flags = (from_host ? CT_FROM_HOST : 0) | ((be.flags & BE_LOCAL) ? CT_BACKEND_LOCAL : 0);
	if (cfg && cfg->node_ip &&
	    ((from_host && (fe->flags & FE_EXTERNAL) && !(be.flags & BE_LOCAL)) ||
	     (!from_host && be.addr == p->saddr) ||
	     (cfg->flags & CFG_MASQUERADE_ALL) ||
	     /* kube-proxy's --cluster-cidr rule: ClusterIP traffic from outside
	      * the cluster is masqueraded. */
	     (from_host && !(fe->flags & FE_EXTERNAL) && cfg->cluster_mask &&
	      (p->saddr & cfg->cluster_mask) != cfg->cluster_net))) {
		snat_addr = cfg->node_ip;
		flags |= CT_SNAT;
	}

	/* Traffic from a workload waits for its egress policy; other traffic has
	 * no source workload to judge it. */
	__u32 slot = from_host ? IFSTATE_NO_POLICY : policy_slot(skb, POLICY_DIR_EGRESS);
	__be16 sport;
	if (ct_create(p, fe->svc_id, &be, &snat_addr, cfg, &flags,
		      slot == IFSTATE_NO_POLICY ? POL_ALLOWED : POL_UNJUDGED, &sport))
		return drop(snat_addr ? CNT_DROP_SNAT_PORTS : CNT_DROP_CT_CREATE);
	if (rewrite_dst(skb, p, be.addr, be.port))
		return drop(CNT_DROP_MALFORMED);
	if (snat_addr && rewrite_src(skb, p, snat_addr, sport))
		return drop(CNT_DROP_MALFORMED);
	if (slot != IFSTATE_NO_POLICY) {
		/* Judged on the tuple the destination will see: after NAT. */
		return policy_handoff(skb, p, POLICY_DIR_EGRESS, slot);
	}
	return TC_ACT_OK;
}

__subprog int handle_icmp(struct __sk_buff *skb, struct packet *p, enum hook hook)
{
	switch (p->icmp_type) {
	case ICMP_ECHO: {
		/* Echo requests are judged packet by packet (ICMP has no conntrack);
		 * replies pass. */
		if (hook == HOOK_FROM_WL || hook == HOOK_TO_WL) {
			int verdict = judge_stateless(skb, p, hook == HOOK_FROM_WL ? POLICY_DIR_EGRESS : POLICY_DIR_INGRESS);
			if (verdict != TC_ACT_OK)
				return verdict;
		}
		struct fe_key key = { .addr = p->daddr, .proto = IPPROTO_ICMP };
		if ((hook != HOOK_FROM_WL && hook != HOOK_FROM_HOST) ||
		    !bpf_map_lookup_elem(&sl_fe_v1, &key))
			return TC_ACT_OK;
		if (answer_echo(skb, p))
			return drop(CNT_DROP_REJECT_FAILED);
		count(CNT_ICMP_ECHO_ANSWERED);
		return bpf_redirect(skb->ifindex, 0);
	}
	case ICMP_DEST_UNREACH:
	case ICMP_TIME_EXCEEDED:
		if (icmp_error_rnat(skb, p))
			return drop(CNT_DROP_MALFORMED);
		return TC_ACT_OK;
	}
	return TC_ACT_OK;
}

static __always_inline int pipeline(struct __sk_buff *skb, enum hook hook)
{
	struct packet p;

	switch (parse_packet(skb, &p)) {
	case PARSE_NOT_IPV4:
		return TC_ACT_OK;
	case PARSE_MALFORMED:
		return drop(CNT_DROP_MALFORMED);
	}
	if (p.fragment) {
		count(CNT_PASS_FRAGMENT);
		return TC_ACT_OK;
	}
	if (p.proto == IPPROTO_ICMP)
		return handle_icmp(skb, &p, hook);
	if (p.proto != IPPROTO_TCP && p.proto != IPPROTO_UDP)
		return TC_ACT_OK;

	struct ct_key key;
	ct_key_of(&p, &key);
	struct ct_value *v = bpf_map_lookup_elem(&sl_ct_v1, &key);
	if (v) {
		ct_touch(v, &p);
		if (ct_apply(skb, &p, v))
			return drop(CNT_DROP_MALFORMED);
		if (v->type == CT_FORWARD && hook == HOOK_FROM_WL)
			return enforce(skb, &p, v, POLICY_DIR_EGRESS);
		if (v->type == CT_FORWARD && hook == HOOK_TO_WL)
			return enforce(skb, &p, v, POLICY_DIR_INGRESS);
		return TC_ACT_OK; /* a reply, or a hook without policy */
	}

	if (hook == HOOK_TO_HOST)
		return TC_ACT_OK;
	if (hook == HOOK_TO_WL)
		return to_workload_new(skb, &p);
	/* Only a connection's first segment is balanced: a segment of a flow
	 * conntrack does not know would reach a backend that never saw its SYN.
	 * A workload's egress policy still judges it, packet by packet. */
	if (p.proto == IPPROTO_TCP && (p.tcp_flags & (TCP_FLAG_SYN | TCP_FLAG_ACK)) != TCP_FLAG_SYN)
		return hook == HOOK_FROM_WL ? judge_stateless(skb, &p, POLICY_DIR_EGRESS) : TC_ACT_OK;
	return new_flow(skb, &p, hook);
}
