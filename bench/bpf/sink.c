// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* The sink of the packet-rate benchmark (packetrate_bench_test.go). Never
 * attached by the agent.
 *
 * The sink drops the generator's packets where they reach the backend, and
 * counts them, so neither a socket nor the backend's stack sets the rate. */

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/tcp.h>
#include <linux/udp.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

char LICENSE[] SEC("license") = "Dual BSD/GPL";

/* The sink's counts: what it dropped, by kind. */
enum sink_kind : __u32 {
	SINK_DATAGRAM,	/* a UDP datagram whose payload starts with SINK_MARK */
	SINK_SYN,	/* a TCP SYN */
	SINK_KINDS,
};

/* The first payload byte of the generator's datagrams; other datagrams
 * (the probes that check a path before a run) pass to the stack. */
#define SINK_MARK 'G'

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, SINK_KINDS);
	__type(key, __u32);
	__type(value, __u64);
} sink_counts SEC(".maps");

static __always_inline int sink_drop(enum sink_kind kind)
{
	__u32 key = kind;
	__u64 *n = bpf_map_lookup_elem(&sink_counts, &key);

	if (n)
		*n += 1;
	return XDP_DROP;
}

/* sink counts and drops the generator's datagrams and every SYN; the rest
 * (ARP, probes, their answers) passes. */
SEC("xdp")
int sink(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	struct iphdr *ip = (void *)(eth + 1);

	if ((void *)(ip + 1) > data_end || eth->h_proto != bpf_htons(ETH_P_IP) || ip->ihl != 5)
		return XDP_PASS;
	if (ip->protocol == IPPROTO_UDP) {
		struct udphdr *udp = (void *)(ip + 1);
		__u8 *mark = (void *)(udp + 1);

		if ((void *)(mark + 1) <= data_end && *mark == SINK_MARK)
			return sink_drop(SINK_DATAGRAM);
	} else if (ip->protocol == IPPROTO_TCP) {
		struct tcphdr *tcp = (void *)(ip + 1);

		if ((void *)(tcp + 1) <= data_end && tcp->syn && !tcp->ack)
			return sink_drop(SINK_SYN);
	}
	return XDP_PASS;
}

/* The ports of the benchmark's wire: a frame arriving on the interface of
 * the key leaves by the interface of the value (ifindexes in the wire's
 * namespace). */
struct {
	__uint(type, BPF_MAP_TYPE_DEVMAP_HASH);
	__uint(max_entries, 4);
	__type(key, __u32);
	__type(value, __u32);
} wire_ports SEC(".maps");

/* wire hands each frame to the wire's other port by an XDP redirect, so
 * that the veth beyond it receives XDP frames, not skbs: what a NIC's
 * driver has before it builds an skb, and what the node's XDP program
 * then runs on without one (packetrate_bench_test.go, frames=xdp). A frame
 * from a port with no other passes. */
SEC("xdp")
int wire(struct xdp_md *ctx)
{
	return bpf_redirect_map(&wire_ports, ctx->ingress_ifindex, XDP_PASS);
}
