package bpftest

import (
	"strconv"
	"strings"
	"testing"
)

// Forwarded reads how many datagrams a namespace's IP stack has forwarded:
// IPv4's Ip ForwDatagrams (/proc/net/snmp) and IPv6's Ip6OutForwDatagrams
// (/proc/net/snmp6). Local delivery (bpf/include/deliver.h) shows as packets
// between pods that these do not count.
func (ns *NetNS) Forwarded(tb testing.TB) (v4, v6 uint64) {
	tb.Helper()
	ip, err := SNMP(ns, "Ip", "ForwDatagrams")
	if err != nil {
		tb.Fatalf("forwarded datagrams of %s: %v", ns.Name, err)
	}
	found6 := false
	for _, line := range strings.Split(ns.Run("cat", "/proc/net/snmp6"), "\n") {
		if f := strings.Fields(line); len(f) == 2 && f[0] == "Ip6OutForwDatagrams" {
			if v6, err = strconv.ParseUint(f[1], 10, 64); err != nil {
				tb.Fatalf("Ip6OutForwDatagrams of %s: %q", ns.Name, f[1])
			}
			found6 = true
		}
	}
	if !found6 {
		tb.Fatalf("Ip6OutForwDatagrams missing from /proc/net/snmp6 of %s", ns.Name)
	}
	return ip["ForwDatagrams"], v6
}
