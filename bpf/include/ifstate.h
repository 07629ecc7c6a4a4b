/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* The interface-state map (sl_ifstate_v1): one entry per interface Sluice
 * manages, written by ifacemgr in step with what it attached and removed when
 * the interface goes (a leaked entry per vanished interface is what exhausted
 * Calico's map). The policy slots are indices into the policy program array
 * that the TC programs tail-call. */
#pragma once

#include "common.h"
#include "consts.h"

#define IFSTATE_NAME_LEN	16
#define IFSTATE_NO_POLICY	0xffffffff

enum ifstate_flags : __u32 {
	IFS_WORKLOAD = 1 << 0,	/* a pod's host-side veth */
	IFS_DATA = 1 << 1,	/* a node data interface */
	IFS_L3 = 1 << 2,	/* an L3 / tunnel device */
	IFS_READY = 1 << 3,	/* every program is attached */
	/* --detect-local-mode=InterfaceNamePrefix: the name starts with
	 * --pod-interface-name-prefix, so traffic entering here is the
	 * cluster's own (kube-proxy's "local" traffic) */
	IFS_LOCAL_TRAFFIC = 1 << 4,
	/* How the interface's XDP program runs, for `sluice iface list`
	 * (the datapath does not read them): in the driver, before an skb
	 * exists, or in the stack's generic hook. */
	IFS_XDP_DRIVER = 1 << 5,
	IFS_XDP_GENERIC = 1 << 6,
};

struct ifstate_key {
	__u32 ifindex;		/* host order */
};
ASSERT_SIZE(struct ifstate_key, 4);

struct ifstate_value {
	enum ifstate_flags flags;		/* host order */
	/* Policy slots (or IFSTATE_NO_POLICY), named from a workload's side.
	 * egress_policy is judged where traffic enters the datapath through
	 * the interface: a workload's egress at FROM_WL; for a data interface
	 * its host endpoint's ingress at FROM_HOST. ingress_policy is judged
	 * where traffic leaves through it: a workload's ingress at TO_WL; a
	 * host endpoint's egress at TO_HOST. Both host order. */
	__u32 ingress_policy;
	__u32 egress_policy;
	char name[IFSTATE_NAME_LEN];		/* NUL-padded interface name */
};
ASSERT_SIZE(struct ifstate_value, 28);

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, SL_IFSTATE_MAX);
	__type(key, struct ifstate_key);
	__type(value, struct ifstate_value);
} sl_ifstate_v1 SEC(".maps");

/* entered_with tells whether a packet entered this node through a managed
 * interface whose state has every bit of flags (skb->ingress_ifindex is 0 for
 * packets the node itself sends). */
static __always_inline int entered_with(struct __sk_buff *skb, enum ifstate_flags flags)
{
	struct ifstate_key k = { .ifindex = skb->ingress_ifindex };
	struct ifstate_value *v;

	if (!k.ifindex)
		return 0;
	v = bpf_map_lookup_elem(&sl_ifstate_v1, &k);
	return v && (v->flags & flags) == flags;
}

/* entered_managed: the packet came through an interface that has Sluice's
 * ingress program, which has handled it already. */
static __always_inline int entered_managed(struct __sk_buff *skb)
{
	return entered_with(skb, IFS_READY);
}

/* entered_local_iface: the packet came through an interface marked
 * IFS_LOCAL_TRAFFIC (--detect-local-mode=InterfaceNamePrefix). */
static __always_inline int entered_local_iface(struct __sk_buff *skb)
{
	return entered_with(skb, IFS_LOCAL_TRAFFIC);
}
