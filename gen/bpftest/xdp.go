package bpftest

import (
	"fmt"
	"net"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
)

// AttachXDP attaches prog to iface in ns, in driver mode, until the test
// ends.
func (ns *NetNS) AttachXDP(tb testing.TB, iface string, prog *ebpf.Program) {
	tb.Helper()
	if err := ns.Do(func() error {
		ifc, err := net.InterfaceByName(iface)
		if err != nil {
			return err
		}
		l, err := link.AttachXDP(link.XDPOptions{Program: prog, Interface: ifc.Index, Flags: link.XDPDriverMode})
		if err != nil {
			return fmt.Errorf("XDP on %s: %w", iface, err)
		}
		tb.Cleanup(func() { l.Close() })
		return nil
	}); err != nil {
		tb.Fatal(err)
	}
}

// PassXDP attaches to iface in ns, in driver mode, an XDP program that
// passes every frame. A veth takes the frames its peer sends from XDP
// (XDP_TX, a redirect) only with an XDP program of its own; with one it
// also receives through NAPI, in the receiving side's poll, as a NIC does.
func (ns *NetNS) PassXDP(tb testing.TB, iface string) {
	tb.Helper()
	pass, err := ebpf.NewProgram(&ebpf.ProgramSpec{Type: ebpf.XDP, License: "GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 2 /* XDP_PASS */), asm.Return()}})
	if err != nil {
		tb.Fatal(err)
	}
	// The link holds the program: it can go once attached.
	defer pass.Close()
	ns.AttachXDP(tb, iface, pass)
}
