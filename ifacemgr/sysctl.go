package ifacemgr

import (
	"fmt"
	"os"
	"path/filepath"
)

// interfaceSysctls are the per-interface settings the datapath needs, set only
// on interfaces Sluice manages (never on "all" or "default"):
//
//   - forwarding=1: the node routes NATed packets between pods and data
//     interfaces.
//   - rp_filter=0: after reverse NAT a reply's source is a service IP that no
//     route leads back to; strict reverse-path filtering would drop it. (The
//     effective value is the larger of this and net.ipv4.conf.all.rp_filter,
//     which must therefore not be 1.)
//   - accept_local=1: packets the datapath rewrote at ingress can carry the
//     node's own address as source — replies of NodePort flows leaving a pod's
//     veth, and external traffic SNATed at a data interface towards a backend on
//     another node — which the kernel otherwise drops as martians.
//
// route_localnet is left alone: NodePorts on 127.0.0.1 are not supported.
var interfaceSysctls = map[Class][][2]string{
	Workload: {{"forwarding", "1"}, {"rp_filter", "0"}, {"accept_local", "1"}},
	Data:     {{"forwarding", "1"}, {"rp_filter", "0"}, {"accept_local", "1"}},
	L3:       {{"forwarding", "1"}, {"rp_filter", "0"}, {"accept_local", "1"}},
}

// DefaultProcSysNet is where net sysctls are when Options.ProcSysNet is empty.
const DefaultProcSysNet = "/proc/sys/net"

// setSysctls writes the class's settings for ifname under procSysNet (call
// inside the interface's namespace: /proc/sys/net resolves in the caller's
// namespace, also through a bind mount of it).
func setSysctls(procSysNet, ifname string, class Class) error {
	if procSysNet == "" {
		procSysNet = DefaultProcSysNet
	}
	for _, kv := range interfaceSysctls[class] {
		path := filepath.Join(procSysNet, "ipv4/conf", ifname, kv[0])
		if err := os.WriteFile(path, []byte(kv[1]), 0o644); err != nil {
			return fmt.Errorf("sysctl %s=%s: %w", path, kv[1], err)
		}
	}
	return nil
}
