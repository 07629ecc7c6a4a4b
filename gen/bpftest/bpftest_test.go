package bpftest_test

import (
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/sluice-net/sluice/gen/bpftest"
)

func TestNamespacesAndVethsAreMadeAndRemoved(t *testing.T) {
	var nsA, nsB string
	t.Run("make", func(t *testing.T) {
		a, b := bpftest.NewNetNS(t), bpftest.NewNetNS(t)
		nsA, nsB = a.Name, b.Name
		v := bpftest.NewVeth(t, a, b)
		a.Run("ip", "addr", "add", "192.0.2.1/24", "dev", v.Name)
		b.Run("ip", "addr", "add", "192.0.2.2/24", "dev", v.PeerName)
		a.Run("ping", "-c", "1", "-W", "2", "192.0.2.2")

		// Do runs on a thread inside the namespace: it sees the veth end.
		err := a.Do(func() error {
			ifs, err := net.Interfaces()
			if err != nil {
				return err
			}
			for _, i := range ifs {
				if i.Name == v.Name {
					return nil
				}
			}
			t.Errorf("interface %s not visible inside %s: %v", v.Name, a.Name, ifs)
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		// ... and the calling goroutine's namespace is unchanged.
		if _, err := net.InterfaceByName(v.Name); err == nil {
			t.Fatalf("interface %s leaked into the test's namespace", v.Name)
		}
	})
	out, err := exec.Command("ip", "netns", "list").CombinedOutput()
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(out), nsA) || strings.Contains(string(out), nsB) {
		t.Fatalf("namespaces left after the test: %s", out)
	}
}

func TestPinDirIsAPrivateBPFFS(t *testing.T) {
	var dir string
	t.Run("mount", func(t *testing.T) {
		dir = bpftest.PinDir(t)
		mounts, err := os.ReadFile("/proc/self/mounts")
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(mounts), dir+" bpf ") {
			t.Fatalf("%s is not a bpffs mount", dir)
		}
	})
	mounts, _ := os.ReadFile("/proc/self/mounts")
	if strings.Contains(string(mounts), dir+" ") {
		t.Fatalf("bpffs %s still mounted after the test", dir)
	}
}

func TestUniqueNamesFitInterfaceNames(t *testing.T) {
	seen := map[string]bool{}
	for range 1000 {
		n := bpftest.UniqueName("slv")
		if len(n) > 15 || seen[n] {
			t.Fatalf("name %q too long or repeated", n)
		}
		seen[n] = true
	}
}
