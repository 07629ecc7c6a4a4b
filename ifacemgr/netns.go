package ifacemgr

import (
	"fmt"

	"github.com/sluice-net/sluice/netlab"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// NetnsCookie returns the cookie of the network namespace at path ("" for the
// current one): what bpf_get_netns_cookie gives a socket there, so the
// socket-LB programs can tell the host's sockets from pods'.
func NetnsCookie(path string) (uint64, error) {
	var cookie uint64
	err := netlab.Enter(path, func() error {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		if cookie, err = unix.GetsockoptUint64(fd, unix.SOL_SOCKET, unix.SO_NETNS_COOKIE); err != nil {
			return fmt.Errorf("SO_NETNS_COOKIE (Linux 5.14+): %w", err)
		}
		return nil
	})
	return cookie, err
}

// HasGlobalIPv6 tells whether the network namespace at path ("" for the
// current one) has an IPv6 address beyond loopback and link-local on any
// interface: a node without one serves no IPv6 Service, and its IPv6 tables
// can be minimal.
func HasGlobalIPv6(path string) (bool, error) {
	var found bool
	err := netlab.Enter(path, func() error {
		addrs, err := netlink.AddrList(nil, netlink.FAMILY_V6)
		if err != nil {
			return fmt.Errorf("list IPv6 addresses: %w", err)
		}
		for _, a := range addrs {
			if ip := a.IP; ip.IsGlobalUnicast() && !ip.IsLinkLocalUnicast() {
				found = true
				return nil
			}
		}
		return nil
	})
	return found, err
}
