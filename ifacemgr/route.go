package ifacemgr

import (
	"fmt"
	"net"
	"net/netip"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// InterfaceForIP returns the interface the namespace at path ("" current)
// routes ip through: how a pod is tied to its host-side interface.
func InterfaceForIP(path string, ip netip.Addr) (string, error) {
	h := netlink.Handle{}
	var err error
	hp := &h
	if path != "" {
		ns, err := netns.GetFromPath(path)
		if err != nil {
			return "", err
		}
		defer ns.Close()
		if hp, err = netlink.NewHandleAt(ns); err != nil {
			return "", err
		}
		defer hp.Close()
	} else if hp, err = netlink.NewHandle(); err != nil {
		return "", err
	} else {
		defer hp.Close()
	}
	routes, err := hp.RouteGet(net.IP(ip.AsSlice()))
	if err != nil || len(routes) == 0 {
		return "", fmt.Errorf("no route to %v: %v", ip, err)
	}
	l, err := hp.LinkByIndex(routes[0].LinkIndex)
	if err != nil {
		return "", err
	}
	return l.Attrs().Name, nil
}
