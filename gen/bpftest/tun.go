package bpftest

import (
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

// TunLink is an L3 point-to-point link between two namespaces made of two
// TUN devices whose packets a relay in this process copies across: packets on
// it carry no Ethernet header, as on ipip, WireGuard or VPN devices.
type TunLink struct {
	Name, PeerName string
}

// NewTunLink creates a TUN device in ns and one in peerNS, both up, and
// relays packets between them until the test ends.
func NewTunLink(tb testing.TB, ns, peerNS *NetNS) TunLink {
	tb.Helper()
	l := TunLink{Name: UniqueName("slu"), PeerName: UniqueName("slq")}
	a := openTun(tb, ns, l.Name)
	b := openTun(tb, peerNS, l.PeerName)
	go relay(a, b)
	go relay(b, a)
	ns.Run("ip", "link", "set", l.Name, "up")
	peerNS.Run("ip", "link", "set", l.PeerName, "up")
	return l
}

func openTun(tb testing.TB, ns *NetNS, name string) *os.File {
	tb.Helper()
	var f *os.File
	err := ns.Do(func() error {
		fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0)
		if err != nil {
			return err
		}
		ifr, err := unix.NewIfreq(name)
		if err != nil {
			unix.Close(fd)
			return err
		}
		ifr.SetUint16(unix.IFF_TUN | unix.IFF_NO_PI)
		if err := unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr); err != nil {
			unix.Close(fd)
			return err
		}
		// Non-blocking, so the runtime's poller serves it and Close ends a
		// pending Read.
		if err := unix.SetNonblock(fd, true); err != nil {
			unix.Close(fd)
			return err
		}
		f = os.NewFile(uintptr(fd), "/dev/net/tun:"+name)
		return nil
	})
	if err != nil {
		tb.Fatalf("create TUN device %s: %v", name, err)
	}
	// Closing the last descriptor deletes the device.
	tb.Cleanup(func() { f.Close() })
	return f
}

func relay(from, to *os.File) {
	buf := make([]byte, 65536)
	for {
		n, err := from.Read(buf)
		if err != nil {
			return
		}
		// A packet the other side refuses (an IPv6 router solicitation in a
		// namespace without IPv6, say) is dropped, as a link would drop it.
		to.Write(buf[:n])
	}
}
