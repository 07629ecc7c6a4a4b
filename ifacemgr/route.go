package ifacemgr

import (
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// PodInterfaces ties pods to their host-side interfaces, for one round of
// lookups: the interface the node routes a pod's IP through (routed veths:
// Calico, Cilium), or, when that is a bridge (the CNI bridge plugin's cni0,
// Flannel), the bridge's veth port whose peer holds the IP. A route to a
// bridge alone would name the bridge, which no pod's policy can be bound to.
// The bridge's ports are read once per round, when first needed.
type PodInterfaces struct {
	h       *netlink.Handle
	ns      netns.NsHandle
	bridges map[int]map[netip.Addr]string // bridge ifindex -> peer IP -> port name
}

// NewPodInterfaces reads the namespace at path ("" the current one).
func NewPodInterfaces(path string) (*PodInterfaces, error) {
	p := &PodInterfaces{ns: netns.None(), bridges: map[int]map[netip.Addr]string{}}
	var err error
	if path == "" {
		p.h, err = netlink.NewHandle()
		return p, err
	}
	if p.ns, err = netns.GetFromPath(path); err != nil {
		return nil, err
	}
	if p.h, err = netlink.NewHandleAt(p.ns); err != nil {
		p.ns.Close()
		return nil, err
	}
	return p, nil
}

// Close releases the handles.
func (p *PodInterfaces) Close() {
	p.h.Close()
	if p.ns.IsOpen() {
		p.ns.Close()
	}
}

// Interface names the host-side interface of the pod holding ip.
func (p *PodInterfaces) Interface(ip netip.Addr) (string, error) {
	routes, err := p.h.RouteGet(net.IP(ip.AsSlice()))
	if err != nil || len(routes) == 0 {
		return "", fmt.Errorf("no route to %v: %v", ip, err)
	}
	l, err := p.h.LinkByIndex(routes[0].LinkIndex)
	if err != nil {
		return "", err
	}
	if l.Type() != "bridge" {
		return l.Attrs().Name, nil
	}
	ports, ok := p.bridges[l.Attrs().Index]
	if !ok {
		if ports, err = p.bridgePorts(l.Attrs().Index); err != nil {
			return "", fmt.Errorf("ports of bridge %s: %w", l.Attrs().Name, err)
		}
		p.bridges[l.Attrs().Index] = ports
	}
	if name, ok := ports[ip]; ok {
		return name, nil
	}
	return "", fmt.Errorf("%v is routed to bridge %s, but no veth port of it leads to %v", ip, l.Attrs().Name, ip)
}

// bridgePorts maps the IPv4 addresses of each veth port's peer to the port.
func (p *PodInterfaces) bridgePorts(bridge int) (map[netip.Addr]string, error) {
	links, err := p.h.LinkList()
	if err != nil {
		return nil, err
	}
	sock, err := nl.GetNetlinkSocketAt(p.ns, netns.None(), unix.NETLINK_ROUTE)
	if err != nil {
		return nil, err
	}
	defer sock.Close()
	// The kernel reads a dump's target namespace only from a socket that
	// asks for strict checking.
	if err := unix.SetsockoptInt(sock.GetFd(), unix.SOL_NETLINK, unix.NETLINK_GET_STRICT_CHK, 1); err != nil {
		return nil, err
	}
	out := map[netip.Addr]string{}
	for _, l := range links {
		a := l.Attrs()
		if a.MasterIndex != bridge || l.Type() != "veth" || a.NetNsID < 0 {
			continue
		}
		addrs, err := peerAddrs(sock, a.NetNsID, a.ParentIndex)
		if err != nil {
			return nil, fmt.Errorf("peer of %s: %w", a.Name, err)
		}
		for _, ip := range addrs {
			out[ip] = a.Name
		}
	}
	return out, nil
}

// peerAddrs lists the IPv4 addresses of interface index in the namespace
// this one knows as nsid (a veth's peer: IFLA_LINK_NETNSID and IFLA_LINK),
// without entering it.
func peerAddrs(sock *nl.NetlinkSocket, nsid, index int) ([]netip.Addr, error) {
	req := nl.NewNetlinkRequest(unix.RTM_GETADDR, unix.NLM_F_DUMP)
	msg := nl.NewIfAddrmsg(unix.AF_INET)
	msg.Index = uint32(index)
	req.AddData(msg)
	req.AddData(nl.NewRtAttr(unix.IFA_TARGET_NETNSID, nl.Uint32Attr(uint32(nsid))))
	req.Sockets = map[int]*nl.SocketHandle{unix.NETLINK_ROUTE: {Socket: sock}}
	msgs, err := req.Execute(unix.NETLINK_ROUTE, unix.RTM_NEWADDR)
	if err != nil && !errors.Is(err, unix.ENODEV) {
		return nil, err
	}
	var out []netip.Addr
	for _, m := range msgs {
		if len(m) < unix.SizeofIfAddrmsg || nl.DeserializeIfAddrmsg(m).Index != uint32(index) {
			continue
		}
		attrs, err := nl.ParseRouteAttr(m[unix.SizeofIfAddrmsg:])
		if err != nil {
			return nil, err
		}
		for _, at := range attrs {
			if at.Attr.Type == unix.IFA_LOCAL {
				if ip, ok := netip.AddrFromSlice(at.Value); ok {
					out = append(out, ip.Unmap())
				}
			}
		}
	}
	return out, nil
}
