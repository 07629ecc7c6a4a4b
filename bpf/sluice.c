// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* Entry programs of Sluice. Each is short: it calls the stages in include/ in order. */

#include "common.h"
#include "datapath.h"
#include "parse.h"
#include "stats.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

/* sl_count counts packets per interface by protocol and passes every packet. It
 * proves the build and test pipeline end to end and is a cheap diagnostic tap. */
SEC("tc")
int sl_count(struct __sk_buff *skb)
{
	struct if_stats *st = if_stats_get(skb->ifindex);
	struct packet p;

	if (!st)
		return TC_ACT_OK;
	__sync_fetch_and_add(&st->packets, 1);
	__sync_fetch_and_add(&st->bytes, skb->len);

	switch (parse_packet(skb, &p)) {
	case PARSE_NOT_IPV4:
		__sync_fetch_and_add(&st->non_ipv4, 1);
		return TC_ACT_OK;
	case PARSE_MALFORMED:
		__sync_fetch_and_add(&st->malformed, 1);
		return TC_ACT_OK;
	}
	__sync_fetch_and_add(&st->ipv4, 1);
	if (p.fragment)
		return TC_ACT_OK;
	if (p.proto == IPPROTO_TCP)
		__sync_fetch_and_add(&st->tcp, 1);
	else if (p.proto == IPPROTO_UDP)
		__sync_fetch_and_add(&st->udp, 1);
	return TC_ACT_OK;
}

/* Ingress of a workload's host-side veth: traffic leaving the pod. */
SEC("tc")
int sl_from_wl(struct __sk_buff *skb)
{
	return pipeline(skb, HOOK_FROM_WL);
}

/* Egress of a workload's host-side veth: traffic entering the pod. */
SEC("tc")
int sl_to_wl(struct __sk_buff *skb)
{
	return pipeline(skb, HOOK_TO_WL);
}

/* Ingress of a data interface: traffic from outside the node. */
SEC("tc")
int sl_from_host(struct __sk_buff *skb)
{
	return pipeline(skb, HOOK_FROM_HOST);
}

/* Egress of a data interface: traffic leaving the node. */
SEC("tc")
int sl_to_host(struct __sk_buff *skb)
{
	return pipeline(skb, HOOK_TO_HOST);
}
