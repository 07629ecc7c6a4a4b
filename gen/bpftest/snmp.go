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
	number := func(what, s string) uint64 {
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			tb.Fatalf("%s of %s: %q", what, ns.Name, s)
		}
		return n
	}
	var header []string
	found4, found6 := false, false
	for _, line := range strings.Split(ns.Run("cat", "/proc/net/snmp"), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || f[0] != "Ip:" {
			continue
		}
		if header == nil {
			header = f
			continue
		}
		for i, name := range header {
			if name == "ForwDatagrams" && i < len(f) {
				v4, found4 = number("Ip ForwDatagrams", f[i]), true
			}
		}
		break
	}
	for _, line := range strings.Split(ns.Run("cat", "/proc/net/snmp6"), "\n") {
		if f := strings.Fields(line); len(f) == 2 && f[0] == "Ip6OutForwDatagrams" {
			v6, found6 = number("Ip6OutForwDatagrams", f[1]), true
		}
	}
	if !found4 || !found6 {
		tb.Fatalf("forwarded datagrams missing from /proc/net/snmp{,6} of %s (IPv4 %v, IPv6 %v)", ns.Name, found4, found6)
	}
	return v4, v6
}
