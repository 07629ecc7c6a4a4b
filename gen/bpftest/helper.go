package bpftest

import (
	"bufio"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strconv"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// HelperMain is a TestMain for packages whose tests start helper processes
// (Cgroup.StartHelper): in a helper it performs the client action and exits,
// otherwise it runs the tests.
func HelperMain(m *testing.M) {
	if action := os.Getenv(HelperEnv); action != "" {
		if err := runHelper(action, os.Args[1:]); err != nil {
			fmt.Println("error:", err)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// runHelper performs one client action and prints what it saw, a line per fact:
//
//	tcp ADDR            connect, send a line, print "peer=<getpeername> answer=<reply>"
//	udp-sendto ADDR     unconnected socket, print "from=<reply source> answer=<reply>"
//	udp-connected ADDR  connected socket: ask, wait for a line on stdin, ask again
//	                    (printing a send or receive error), then ask on a new socket
//	connect-loop ADDR N N connects and closes, print "ns=<mean connect time>"
//	tcp-mapped ADDR     as tcp, from a dual-stack IPv6 socket to ADDR's
//	                    IPv4-mapped address (::ffff:a.b.c.d)
//
// An ADDR in brackets is IPv6, and its socket an IPv6 one.
func runHelper(action string, args []string) error {
	addr := args[0]
	switch action {
	case "tcp-mapped":
		return tcpMapped(addr)
	case "tcp": // connect, report the peer and the server's answer
		c, err := net.DialTimeout(family(addr, "tcp"), addr, 2*time.Second)
		if err != nil {
			return err
		}
		defer c.Close()
		fmt.Fprintf(c, "hi\n")
		c.SetReadDeadline(time.Now().Add(2 * time.Second))
		answer, err := bufio.NewReader(c).ReadString('\n')
		if err != nil {
			return err
		}
		fmt.Printf("peer=%s answer=%s", c.RemoteAddr(), answer)
	case "udp-sendto": // unconnected socket: sendto, then report the reply's source
		pc, err := net.ListenPacket(family(addr, "udp"), ":0")
		if err != nil {
			return err
		}
		defer pc.Close()
		dst, err := net.ResolveUDPAddr(family(addr, "udp"), addr)
		if err != nil {
			return err
		}
		if _, err := pc.WriteTo([]byte("q"), dst); err != nil {
			return err
		}
		pc.SetReadDeadline(time.Now().Add(2 * time.Second))
		buf := make([]byte, 512)
		n, from, err := pc.ReadFrom(buf)
		if err != nil {
			return err
		}
		fmt.Printf("from=%s answer=%s\n", from, buf[:n])
	case "udp-connected": // one connected socket: ask, wait for the parent, ask again, reconnect
		ask := func(c net.Conn, q string) string {
			if _, err := c.Write([]byte(q)); err != nil {
				return "send-error=" + err.Error()
			}
			c.SetReadDeadline(time.Now().Add(2 * time.Second))
			buf := make([]byte, 512)
			n, err := c.Read(buf)
			if err != nil {
				return "recv-error=" + err.Error()
			}
			return "answer=" + string(buf[:n])
		}
		c, err := net.Dial(family(addr, "udp"), addr)
		if err != nil {
			return err
		}
		fmt.Println(ask(c, "1"))
		bufio.NewReader(os.Stdin).ReadString('\n') // the parent removes the backend
		fmt.Println(ask(c, "2"))
		c.Close()
		c, err = net.Dial(family(addr, "udp"), addr)
		if err != nil {
			return err
		}
		defer c.Close()
		fmt.Println(ask(c, "3"))
	case "connect-loop": // N connects and closes; print the mean connect() time
		n, err := strconv.Atoi(args[1])
		if err != nil {
			return err
		}
		for range 200 { // warm up: caches, the listener's accept loop
			if c, err := net.Dial("tcp4", addr); err == nil {
				c.Close()
			}
		}
		var total time.Duration
		for range n {
			start := time.Now()
			c, err := net.Dial("tcp4", addr)
			total += time.Since(start)
			if err != nil {
				return err
			}
			c.Close()
		}
		fmt.Printf("ns=%d\n", total.Nanoseconds()/int64(n))
	default:
		return fmt.Errorf("unknown helper action %q", action)
	}
	return nil
}

// tcpMapped connects an AF_INET6 socket that accepts IPv4 (IPV6_V6ONLY off,
// as most dual-stack servers and clients open them) to the IPv4-mapped form
// of an IPv4 ADDR, and prints what the tcp action prints: Go's net package
// would open an AF_INET socket for it.
func tcpMapped(addr string) error {
	ap, err := netip.ParseAddrPort(addr)
	if err != nil || !ap.Addr().Is4() {
		return fmt.Errorf("tcp-mapped %q: want an IPv4 address:port", addr)
	}
	fd, err := unix.Socket(unix.AF_INET6, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	if err := unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_V6ONLY, 0); err != nil {
		unix.Close(fd)
		return err
	}
	if err := unix.Connect(fd, &unix.SockaddrInet6{Port: int(ap.Port()), Addr: netip.AddrFrom16(ap.Addr().As16()).As16()}); err != nil {
		unix.Close(fd)
		return err
	}
	peer, err := unix.Getpeername(fd)
	if err != nil {
		unix.Close(fd)
		return err
	}
	p6, ok := peer.(*unix.SockaddrInet6)
	if !ok {
		unix.Close(fd)
		return fmt.Errorf("getpeername: %T", peer)
	}
	f := os.NewFile(uintptr(fd), "tcp-mapped")
	c, err := net.FileConn(f)
	f.Close()
	if err != nil {
		return err
	}
	defer c.Close()
	fmt.Fprintf(c, "hi\n")
	c.SetReadDeadline(time.Now().Add(2 * time.Second))
	answer, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	fmt.Printf("peer=%s answer=%s", netip.AddrPortFrom(netip.AddrFrom16(p6.Addr), uint16(p6.Port)), answer)
	return nil
}
