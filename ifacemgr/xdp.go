package ifacemgr

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
)

// XDPMode is how an XDP program is attached.
type XDPMode string

// XDP attach modes.
const (
	XDPDriver  XDPMode = "driver"  // in the driver, before an skb exists
	XDPGeneric XDPMode = "generic" // in the stack, for drivers without XDP support
)

// AttachXDP attaches prog to the interface in driver mode, or in generic mode
// when the driver does not support XDP. The returned link detaches it on Close.
func AttachXDP(ifindex int, prog *ebpf.Program) (link.Link, XDPMode, error) {
	return attachXDP(ifindex, prog, false)
}

// AttachXDPDriver attaches prog in driver mode, or fails: for a program
// whose point is to run before an skb exists (--xdp-acceleration=native).
func AttachXDPDriver(ifindex int, prog *ebpf.Program) (link.Link, error) {
	l, _, err := attachXDP(ifindex, prog, true)
	return l, err
}

func attachXDP(ifindex int, prog *ebpf.Program, driverOnly bool) (link.Link, XDPMode, error) {
	l, err := link.AttachXDP(link.XDPOptions{Program: prog, Interface: ifindex, Flags: link.XDPDriverMode})
	if err == nil {
		return l, XDPDriver, nil
	}
	if driverOnly {
		return nil, "", fmt.Errorf("attach XDP %v to ifindex %d in driver mode (the driver has no XDP support, or refuses this program): %w", prog, ifindex, err)
	}
	driverErr := err
	l, err = link.AttachXDP(link.XDPOptions{Program: prog, Interface: ifindex, Flags: link.XDPGenericMode})
	if err != nil {
		return nil, "", fmt.Errorf("attach XDP %v to ifindex %d: driver mode: %v; generic mode: %w", prog, ifindex, driverErr, err)
	}
	return l, XDPGeneric, nil
}

// xdpModeOf reads how the interface's XDP program runs, as the kernel reports
// it: "" when none is attached.
func xdpModeOf(h *netlink.Handle, ifindex int) XDPMode {
	l, err := h.LinkByIndex(ifindex)
	if err != nil || l.Attrs().Xdp == nil || !l.Attrs().Xdp.Attached {
		return ""
	}
	switch l.Attrs().Xdp.AttachMode {
	case nl.XDP_ATTACHED_DRV, nl.XDP_ATTACHED_HW:
		return XDPDriver
	case nl.XDP_ATTACHED_SKB:
		return XDPGeneric
	}
	return ""
}

// SocketLB is the set of socket load-balancing programs, attached to one cgroup.
type SocketLB struct {
	links []link.Link
}

// SocketLBPrograms are the programs of the socket load-balancing set
// (gen.SluicePrograms has them as SlConnect4 and so on).
type SocketLBPrograms struct {
	Connect4, Sendmsg4, Recvmsg4, Getpeername4, SockEgress *ebpf.Program
	// The IPv6 hooks; nil leaves IPv6 sockets unbalanced.
	Connect6, Sendmsg6, Recvmsg6, Getpeername6 *ebpf.Program
}

// AttachSocketLB attaches the programs to the cgroup v2 at path: every socket
// of a process in that cgroup or below is balanced at connect() and sendmsg().
// The agent uses the cgroup v2 root; tests use a child cgroup they created.
//
// With pinDir set, each link is pinned there as "cgroup_<hook>", so the
// programs stay when the agent stops; a later call adopts a pinned link that
// runs the same code and replaces other programs in place.
func AttachSocketLB(path, pinDir string, p SocketLBPrograms) (*SocketLB, error) {
	s := &SocketLB{}
	for _, a := range socketLBHooks(p) {
		if a.prog == nil && a.ipv6 {
			continue
		}
		l, err := attachCgroup(path, pinDir, a.name, a.prog, a.at)
		if err != nil {
			s.Close()
			return nil, err
		}
		s.links = append(s.links, l)
	}
	return s, nil
}

type cgroupHook struct {
	name string
	prog *ebpf.Program
	at   ebpf.AttachType
	ipv6 bool
}

func socketLBHooks(p SocketLBPrograms) []cgroupHook {
	return []cgroupHook{
		{"connect4", p.Connect4, ebpf.AttachCGroupInet4Connect, false},
		{"sendmsg4", p.Sendmsg4, ebpf.AttachCGroupUDP4Sendmsg, false},
		{"recvmsg4", p.Recvmsg4, ebpf.AttachCGroupUDP4Recvmsg, false},
		{"getpeername4", p.Getpeername4, ebpf.AttachCgroupInet4GetPeername, false},
		{"sock_egress", p.SockEgress, ebpf.AttachCGroupInetEgress, false},
		{"connect6", p.Connect6, ebpf.AttachCGroupInet6Connect, true},
		{"sendmsg6", p.Sendmsg6, ebpf.AttachCGroupUDP6Sendmsg, true},
		{"recvmsg6", p.Recvmsg6, ebpf.AttachCGroupUDP6Recvmsg, true},
		{"getpeername6", p.Getpeername6, ebpf.AttachCgroupInet6GetPeername, true},
	}
}

func attachCgroup(path, pinDir, name string, prog *ebpf.Program, at ebpf.AttachType) (link.Link, error) {
	pin := ""
	if pinDir != "" {
		pin = filepath.Join(pinDir, "cgroup_"+name)
		if l, err := link.LoadPinnedLink(pin, nil); err == nil {
			info, ierr := l.Info()
			want, perr := prog.Info()
			if ierr == nil && perr == nil && sameProgram(info.Program, want) {
				return l, nil
			}
			if err := l.Update(prog); err == nil {
				return l, nil
			}
			_ = l.Unpin()
			l.Close()
		}
	}
	l, err := link.AttachCgroup(link.CgroupOptions{Path: path, Attach: at, Program: prog})
	if err != nil {
		return nil, fmt.Errorf("attach %v to cgroup %s: %w", prog, path, err)
	}
	if pin != "" {
		if err := os.MkdirAll(pinDir, 0o700); err != nil {
			l.Close()
			return nil, err
		}
		if err := l.Pin(pin); err != nil {
			l.Close()
			return nil, fmt.Errorf("pin %s: %w", pin, err)
		}
	}
	return l, nil
}

// RemoveSocketLB unpins the socket-LB links under pinDir, detaching them.
func RemoveSocketLB(pinDir string) error {
	var errs []error
	for _, h := range socketLBHooks(SocketLBPrograms{}) {
		errs = append(errs, unpinLink(filepath.Join(pinDir, "cgroup_"+h.name)))
	}
	return errors.Join(errs...)
}

// Close releases the handles; unpinned links detach, pinned ones stay.
func (s *SocketLB) Close() error {
	var errs []error
	for _, l := range s.links {
		errs = append(errs, l.Close())
	}
	s.links = nil
	return errors.Join(errs...)
}
