package ifacemgr

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
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
	l, err := link.AttachXDP(link.XDPOptions{Program: prog, Interface: ifindex, Flags: link.XDPDriverMode})
	if err == nil {
		return l, XDPDriver, nil
	}
	driverErr := err
	l, err = link.AttachXDP(link.XDPOptions{Program: prog, Interface: ifindex, Flags: link.XDPGenericMode})
	if err != nil {
		return nil, "", fmt.Errorf("attach XDP %v to ifindex %d: driver mode: %v; generic mode: %w", prog, ifindex, driverErr, err)
	}
	return l, XDPGeneric, nil
}

// SocketLB is the set of socket load-balancing programs, attached to one cgroup.
type SocketLB struct {
	links []link.Link
}

// SocketLBPrograms are the programs of the socket load-balancing set
// (gen.SluicePrograms has them as SlConnect4 and so on).
type SocketLBPrograms struct {
	Connect4, Sendmsg4, Recvmsg4, Getpeername4, SockEgress *ebpf.Program
}

// AttachSocketLB attaches the programs to the cgroup v2 at path: every socket
// of a process in that cgroup or below is balanced at connect() and sendmsg().
// The agent uses the cgroup v2 root; tests use a child cgroup they created.
func AttachSocketLB(path string, p SocketLBPrograms) (*SocketLB, error) {
	s := &SocketLB{}
	for _, a := range []struct {
		prog *ebpf.Program
		at   ebpf.AttachType
	}{
		{p.Connect4, ebpf.AttachCGroupInet4Connect},
		{p.Sendmsg4, ebpf.AttachCGroupUDP4Sendmsg},
		{p.Recvmsg4, ebpf.AttachCGroupUDP4Recvmsg},
		{p.Getpeername4, ebpf.AttachCgroupInet4GetPeername},
		{p.SockEgress, ebpf.AttachCGroupInetEgress},
	} {
		l, err := link.AttachCgroup(link.CgroupOptions{Path: path, Attach: a.at, Program: a.prog})
		if err != nil {
			s.Close()
			return nil, fmt.Errorf("attach %v to cgroup %s: %w", a.prog, path, err)
		}
		s.links = append(s.links, l)
	}
	return s, nil
}

// Close detaches every program of the set.
func (s *SocketLB) Close() error {
	var errs []error
	for _, l := range s.links {
		errs = append(errs, l.Close())
	}
	s.links = nil
	return errors.Join(errs...)
}
