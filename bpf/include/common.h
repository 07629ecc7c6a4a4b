/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Includes and small helpers shared by every Sluice program. */
#pragma once

#include <linux/types.h>
#include <linux/bpf.h>
#include <linux/pkt_cls.h>
#include <linux/if_ether.h>
#include <linux/ip.h>
#include <linux/in.h>
#include <linux/tcp.h>
#include <linux/udp.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

/* <linux/icmp.h> pulls in libc headers that the BPF target cannot use, so the
 * few ICMP definitions the datapath needs live here (values from RFC 792). */
#define ICMP_ECHOREPLY		0
#define ICMP_DEST_UNREACH	3
#define ICMP_ECHO		8
#define ICMP_TIME_EXCEEDED	11
#define ICMP_PORT_UNREACH	3	/* code of ICMP_DEST_UNREACH */
#define ICMP_FRAG_NEEDED	4	/* code of ICMP_DEST_UNREACH */

/* ICMPv6 (RFC 4443): its header has the layout of struct icmphdr. */
#define IPPROTO_ICMPV6		58
#define ICMPV6_DEST_UNREACH	1
#define ICMPV6_PKT_TOOBIG	2
#define ICMPV6_TIME_EXCEED	3
#define ICMPV6_ECHO_REQUEST	128
#define ICMPV6_ECHO_REPLY	129
#define ICMPV6_PORT_UNREACH	4	/* code of ICMPV6_DEST_UNREACH */

/* TCP's flag bits, as the header's 14th byte holds them; conntrack records
 * them per direction, and SCTP's chunks in their terms (sctp.h). */
#define TCP_FLAG_FIN	0x01
#define TCP_FLAG_SYN	0x02
#define TCP_FLAG_RST	0x04
#define TCP_FLAG_ACK	0x10

struct icmphdr {
	__u8 type;
	__u8 code;
	__sum16 checksum;	/* network order */
	union {
		struct {
			__be16 id;		/* network order */
			__be16 sequence;	/* network order */
		} echo;
		__be32 gateway;
		struct {
			__be16 unused;
			__be16 mtu;		/* network order */
		} frag;
	} un;
};

/* What a full hash map's update returns (-E2BIG, asm-generic/errno-base.h);
 * <linux/errno.h> is not usable from BPF programs here. */
#define E2BIG			7
/* What a BPF_NOEXIST update of an existing key returns (-EEXIST). */
#define EEXIST			17

#define __always_inline inline __attribute__((always_inline))
/* A BPF subprogram: its stack frame is its own, so a rare path with large
 * locals does not add to the stack of the common path it branches from. */
#define __subprog static __attribute__((noinline))

/* sl_slot0 is the key of a one-slot per-CPU map (scratch space), as a
 * constant: a key on the stack would cost a frame 8 bytes, and frames on
 * the verifier's deepest call chains have none to spare. */
static const __u32 sl_slot0 = 0;

/* sl_now is the datapath's clock: CLOCK_MONOTONIC at the kernel tick's
 * resolution (a few ms), the clock of every timestamp in the maps
 * (conntrack, affinity, fragments, socket translations, events). Their
 * timeouts are a quarter second and up, and the coarse read costs a few ns
 * where bpf_ktime_get_ns costs about 30 here (a clock read per established
 * packet, several per new flow). It lags the precise clock by at most a
 * tick, so userspace comparing with CLOCK_MONOTONIC sees entries as up to a
 * tick older. */
static __always_inline __u64 sl_now(void)
{
	return bpf_ktime_get_coarse_ns();
}

/* sl_now_tick is sl_now for the established path, which reads the clock
 * on every packet (ct_touch): the coarse clock only moves at a tick, so its
 * value is read once a tick (a jiffy) and kept in sl_clock. The jiffies
 * counter is one load (the verifier inlines bpf_jiffies64), where the call
 * of bpf_ktime_get_coarse_ns cost 40-50 ns a packet on a kernel whose
 * returns go through thunks (this machine's, against SRSO). A CPU that sees
 * the jiffy move before the tick has moved the coarse clock keeps the older
 * value for that jiffy: this clock lags the precise one by at most two
 * ticks. Every CPU shares sl_clock: it is written once a tick, by the
 * first CPU to see the jiffy (the value before the jiffy, so a reader that
 * sees the jiffy sees its value or a newer one). The new-flow paths keep
 * sl_now: their frames are at the verifier's bound, and a clock read there
 * is a small part of their cost. */
struct sl_clock {
	__u64 jiffies;
	__u64 ns;
};

static volatile struct sl_clock sl_clock;

static __always_inline __u64 sl_now_tick(void)
{
	if (sl_clock.jiffies != bpf_jiffies64()) {
		/* The jiffy is read again rather than kept across the call:
		 * fewer values live across it, and the callers' frames are
		 * tight. A jiffy that moved in between gets the value read
		 * just before it, within the two ticks. */
		sl_clock.ns = bpf_ktime_get_coarse_ns();
		sl_clock.jiffies = bpf_jiffies64();
	}
	return sl_clock.ns;
}

/* Layout guard: a key or value whose size drifts from what Go expects fails to build. */
#define ASSERT_SIZE(type, size) _Static_assert(sizeof(type) == (size), #type " layout changed: bump the map version")
