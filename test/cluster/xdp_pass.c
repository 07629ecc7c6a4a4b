/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Passes every frame: on the bridge side of each node's veth (up.sh), so
 * the veth takes the frames a node sends from XDP (a veth delivers XDP_TX
 * and redirected frames only to a peer that runs an XDP program). */
#include <linux/bpf.h>

__attribute__((section("xdp"), used)) int xdp_pass(struct xdp_md *ctx)
{
	(void)ctx;
	return XDP_PASS;
}

char _license[] __attribute__((section("license"), used)) = "GPL";
