package agent

import (
	"fmt"
	"net/netip"
	"os"
	"strings"
	"testing"

	"github.com/sluice-net/sluice/gen/bpftest"
	"github.com/sluice-net/sluice/netlab"
)

// --ipv6-tables=auto sizes the IPv6 tables full only on a node with IPv6:
// an address beyond loopback and link-local in its namespace, an IPv6 node
// IP, or an IPv6 cluster CIDR. full and minimal say it outright; another
// value is refused, naming it.
func TestIPv6TablesFollowTheNode(t *testing.T) {
	bpftest.Require(t) // namespaces need root
	lab := &netlab.Lab{Prefix: fmt.Sprintf("slv6t%d", os.Getpid()%10000)}
	defer lab.Close()
	node, err := lab.Namespace("node")
	if err != nil {
		t.Fatal(err)
	}
	if out, err := netlab.IP("-n", node, "link", "add", "eth0", "type", "veth", "peer", "name", "eth1"); err != nil {
		t.Fatal(out, err)
	}
	if out, err := netlab.IP("-n", node, "link", "set", "eth1", "up"); err != nil {
		t.Fatal(out, err)
	}
	if out, err := netlab.IP("-n", node, "link", "set", "eth0", "up"); err != nil {
		t.Fatal(out, err)
	}
	if out, err := netlab.IP("-n", node, "addr", "add", "10.200.0.1/24", "dev", "eth0"); err != nil {
		t.Fatal(out, err)
	}
	path := netlab.Path(node)
	check := func(step string, cfg Config, want bool) {
		t.Helper()
		cfg.Netns = path
		got, why, err := cfg.nodeHasIPv6()
		if err != nil || got != want || (!got && why == "") {
			t.Fatalf("%s: full %v (%q), %v; want full %v", step, got, why, err, want)
		}
	}
	// The veth's link-local address and loopback's ::1 do not count.
	check("IPv4 only", Config{}, false)
	check("IPv4 only, auto", Config{IPv6Tables: "auto"}, false)
	check("an IPv6 node IP", Config{NodeIPs: []netip.Addr{netip.MustParseAddr("fd00:89::10")}}, true)
	check("an IPv6 cluster CIDR", Config{ClusterCIDR6: netip.MustParsePrefix("fd00:244::/56")}, true)
	check("full", Config{IPv6Tables: "full"}, true)
	if out, err := netlab.IP("-n", node, "addr", "add", "fd00:89::10/64", "dev", "eth0", "nodad"); err != nil {
		t.Fatal(out, err)
	}
	check("a ULA address", Config{}, true)
	check("minimal", Config{IPv6Tables: "minimal"}, false)
	if _, _, err := (Config{IPv6Tables: "small"}).nodeHasIPv6(); err == nil || !strings.Contains(err.Error(), `"small"`) {
		t.Fatalf("--ipv6-tables=small: %v", err)
	}
}
