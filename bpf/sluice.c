// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* Entry programs of Sluice. Each is short: it calls the stages in include/ in order. */

#include "common.h"
#include "datapath.h"
#include "datapath6.h"
#include "fib.h"
#include "deliver.h"
#include "events.h"
#include "ifstate.h"
#include "parse.h"
#include "prefilter.h"
#include "socklb.h"
#include "xdp_accel.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

/* sl_write_span's program array: slot 0 holds it, put there by the loader
 * (gen.Load) on every load. Pinned with the other maps, so that programs a
 * restarted agent keeps attached (the same code on the same maps) reach the
 * new load's writer, and an agent that exits leaves it filled. An empty slot
 * (a load by other means) costs the helper's store (write_span). */
struct {
	__uint(type, BPF_MAP_TYPE_PROG_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} sl_spanwriter_v1 SEC(".maps");

/* write_span carries out WRITE_SPAN in an entry program: the writer, or
 * the helper when the slot is empty. */
static __always_inline int write_span(struct __sk_buff *skb)
{
	bpf_tail_call(skb, &sl_spanwriter_v1, 0);
	if (skb->protocol == bpf_htons(ETH_P_IPV6)) {
		struct nat6_span *span6 = bpf_map_lookup_elem(&sl_span6_v1, &sl_slot0);
		if (!span6 || bpf_skb_store_bytes(skb, span6->l3_off + IP6_SADDR_OFF, span6,
						  span6->len == NAT6_SPAN_TCP ? NAT6_SPAN_TCP : NAT6_SPAN_UDP, 0))
			return drop(CNT_DROP_MALFORMED);
		return TC_ACT_OK;
	}
	struct nat_span *span = bpf_map_lookup_elem(&sl_span_v1, &sl_slot0);
	if (!span || bpf_skb_store_bytes(skb, span->l3_off + NAT_SPAN_OFF, span,
					 span->len == NAT_SPAN_TCP ? NAT_SPAN_TCP : NAT_SPAN_UDP, 0))
		return drop(CNT_DROP_MALFORMED);
	return TC_ACT_OK;
}

/* finish ends a TC entry program: a deferred translation is written
 * (write_span), a drop writes its event (events.h), then the verdict is
 * carried out (policy_dispatch). */
static __always_inline int finish(struct __sk_buff *skb, int verdict, enum hook hook, const __u32 l2_len)
{
	/* fib_forward reads an Ethernet frame; an L3 device's packet goes to
	 * the stack. */
	if (verdict == FORWARD_BY_FIB && !l2_len)
		verdict = TC_ACT_OK;
	if (verdict == WRITE_SPAN)
		return write_span(skb);
	if (verdict == TC_ACT_SHOT)
		ev_drop(skb, hook, l2_len);
	return policy_dispatch(skb, verdict);
}

/* Ingress of a workload's host-side veth: traffic leaving the pod. */
SEC("tc")
int sl_from_wl(struct __sk_buff *skb)
{
	int verdict = pipeline(skb, HOOK_FROM_WL, ETH_HLEN);

	/* What else the pipeline passes to the stack (a flow's first packet,
	 * ICMP) may be for a workload here too; an established flow's packets
	 * have asked local delivery already (deliver_flow). */
	if (verdict == TC_ACT_OK && skb->protocol == bpf_htons(ETH_P_IP))
		verdict = deliver_local(skb, NULL);
	else if (verdict == TC_ACT_OK && skb->protocol == bpf_htons(ETH_P_IPV6))
		verdict = deliver_local6(skb, NULL);
	if (verdict == ROUTED_BY_STACK)
		verdict = TC_ACT_OK;
	return finish(skb, verdict, HOOK_FROM_WL, ETH_HLEN);
}

/* Egress of a workload's host-side veth: traffic entering the pod. */
SEC("tc")
int sl_to_wl(struct __sk_buff *skb)
{
	return finish(skb, pipeline(skb, HOOK_TO_WL, ETH_HLEN), HOOK_TO_WL, ETH_HLEN);
}

/* Ingress of a data interface: traffic from outside the node. */
SEC("tc")
int sl_from_host(struct __sk_buff *skb)
{
	return finish(skb, pipeline(skb, HOOK_FROM_HOST, ETH_HLEN), HOOK_FROM_HOST, ETH_HLEN);
}

/* Egress of a data interface: traffic leaving the node. */
SEC("tc")
int sl_to_host(struct __sk_buff *skb)
{
	return finish(skb, pipeline(skb, HOOK_TO_HOST, ETH_HLEN), HOOK_TO_HOST, ETH_HLEN);
}

/* Ingress of an L3 device (ipip, WireGuard, TUN): packets start with the IP
 * header. */
SEC("tc")
int sl_from_host_l3(struct __sk_buff *skb)
{
	return finish(skb, pipeline(skb, HOOK_FROM_HOST, 0), HOOK_FROM_HOST, 0);
}

/* Egress of an L3 device. */
SEC("tc")
int sl_to_host_l3(struct __sk_buff *skb)
{
	return finish(skb, pipeline(skb, HOOK_TO_HOST, 0), HOOK_TO_HOST, 0);
}

/* cgroup/connect4: balance a connect() to a service. */
SEC("cgroup/connect4")
int sl_connect4(struct bpf_sock_addr *ctx)
{
	return socklb_translate(ctx);
}

/* cgroup/sendmsg4: balance a sendto() on an unconnected UDP socket. */
SEC("cgroup/sendmsg4")
int sl_sendmsg4(struct bpf_sock_addr *ctx)
{
	return socklb_translate(ctx);
}

/* cgroup/recvmsg4: replies come from the service, not the backend. */
SEC("cgroup/recvmsg4")
int sl_recvmsg4(struct bpf_sock_addr *ctx)
{
	return socklb_reverse(ctx, SOCK_REVNAT_TIMEOUT_NS);
}

/* cgroup/getpeername4: the peer is the service, not the backend. */
SEC("cgroup/getpeername4")
int sl_getpeername4(struct bpf_sock_addr *ctx)
{
	return socklb_reverse(ctx, 0);
}

/* cgroup/connect6: balance an IPv6 socket's connect() (an IPv4-mapped
 * destination on the IPv4 maps). */
SEC("cgroup/connect6")
int sl_connect6(struct bpf_sock_addr *ctx)
{
	return socklb_translate6(ctx);
}

/* cgroup/sendmsg6: balance a sendto() on an unconnected IPv6 UDP socket. */
SEC("cgroup/sendmsg6")
int sl_sendmsg6(struct bpf_sock_addr *ctx)
{
	return socklb_translate6(ctx);
}

/* cgroup/recvmsg6: replies come from the service, not the backend. */
SEC("cgroup/recvmsg6")
int sl_recvmsg6(struct bpf_sock_addr *ctx)
{
	return socklb_reverse6(ctx, SOCK_REVNAT_TIMEOUT_NS);
}

/* cgroup/getpeername6: the peer is the service, not the backend. */
SEC("cgroup/getpeername6")
int sl_getpeername6(struct bpf_sock_addr *ctx)
{
	return socklb_reverse6(ctx, 0);
}

/* cgroup_skb/egress: a UDP socket pinned to a backend that left fails its send. */
SEC("cgroup_skb/egress")
int sl_sock_egress(struct __sk_buff *skb)
{
	return socklb_check_egress(skb);
}

/* xdp: the prefilter on data interfaces. */
SEC("xdp")
int sl_xdp_prefilter(struct xdp_md *ctx)
{
	return prefilter(ctx);
}

/* xdp: the prefilter, then the acceleration of external flows
 * (xdp_accel.h), on data interfaces where the agent is asked for it. */
SEC("xdp")
int sl_xdp_accel(struct xdp_md *ctx)
{
	int verdict = prefilter(ctx);

	if (verdict != XDP_PASS)
		return verdict;
	return xdp_accel(ctx);
}

/* Slot 0 of sl_spanwriter_v1: writes an established packet's translation, built
 * by its entry program, with direct writes (rewrite.h). */
SEC("tc")
int sl_write_span(struct __sk_buff *skb)
{
	if (skb->protocol == bpf_htons(ETH_P_IPV6))
		return span6_write_direct(skb);
	return span_write_direct(skb);
}

/* Slot 0 of sl_polprog_v1: records a policy program's verdict (policy.h). */
SEC("tc")
int sl_policy_verdict(struct __sk_buff *skb)
{
	return policy_verdict(skb);
}
