package datapathtest_test

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"net"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/sluice-net/sluice/gen/bpftest"
)

// This kernel has no SCTP sockets: these tests speak SCTP over raw IP
// protocol 132 sockets, a tiny association each side (RFC 9260: INIT, INIT
// ACK, COOKIE ECHO, COOKIE ACK, DATA and SACK both ways, SHUTDOWN, SHUTDOWN
// ACK, SHUTDOWN COMPLETE), and check the CRC32c of every packet received.

const (
	sctpServicePort = 3868 // the Service's port
	sctpTargetPort  = 3869 // the backend's: every packet's ports are translated
	sctpClientPort  = 40001
)

// sctpChunk is a packet's first chunk.
type sctpChunk struct {
	sport, dport uint16
	vtag         uint32
	typ          uint8
	value        []byte
	from         netip.Addr
}

// sctpBuild builds an SCTP packet of one chunk, its CRC32c computed.
func sctpBuild(sport, dport uint16, vtag uint32, typ uint8, value []byte) []byte {
	b := make([]byte, 16, 16+len(value)+3)
	binary.BigEndian.PutUint16(b[0:], sport)
	binary.BigEndian.PutUint16(b[2:], dport)
	binary.BigEndian.PutUint32(b[4:], vtag)
	b[12] = typ
	binary.BigEndian.PutUint16(b[14:], uint16(4+len(value)))
	b = append(b, value...)
	for len(b)%4 != 0 {
		b = append(b, 0)
	}
	binary.LittleEndian.PutUint32(b[8:], crc32.Checksum(b, crc32.MakeTable(crc32.Castagnoli)))
	return b
}

// sctpEndpoint is one side's raw socket, in its namespace.
type sctpEndpoint struct {
	conn    *net.IPConn
	badCRCs int
}

func listenSCTP(t *testing.T, ns *bpftest.NetNS, addr netip.Addr) *sctpEndpoint {
	t.Helper()
	network := "ip4:132"
	if addr.Is6() {
		network = "ip6:132"
	}
	var conn *net.IPConn
	if err := ns.Do(func() (err error) {
		conn, err = net.ListenIP(network, &net.IPAddr{IP: addr.AsSlice()})
		return err
	}); err != nil {
		t.Fatalf("raw SCTP socket on %v: %v", addr, err)
	}
	t.Cleanup(func() { conn.Close() })
	return &sctpEndpoint{conn: conn}
}

func (e *sctpEndpoint) send(to netip.Addr, sport, dport uint16, vtag uint32, typ uint8, value []byte) error {
	_, err := e.conn.WriteToIP(sctpBuild(sport, dport, vtag, typ, value), &net.IPAddr{IP: to.AsSlice()})
	return err
}

// next reads packets to port until one comes, counting those whose CRC is
// wrong (and dropping them, as an SCTP stack would).
func (e *sctpEndpoint) next(port uint16, deadline time.Duration) (sctpChunk, error) {
	buf := make([]byte, 65536)
	if err := e.conn.SetReadDeadline(time.Now().Add(deadline)); err != nil {
		return sctpChunk{}, err
	}
	for {
		n, from, err := e.conn.ReadFromIP(buf)
		if err != nil {
			return sctpChunk{}, err
		}
		b := buf[:n]
		if n < 16 || binary.BigEndian.Uint16(b[2:]) != port {
			continue
		}
		if err := bpftest.SCTPChecksum(b); err != nil {
			e.badCRCs++
			continue
		}
		addr, _ := netip.AddrFromSlice(from.IP)
		l := int(binary.BigEndian.Uint16(b[14:]))
		if l < 4 || 12+l > n {
			return sctpChunk{}, fmt.Errorf("chunk length %d in a %d-byte packet", l, n)
		}
		return sctpChunk{sport: binary.BigEndian.Uint16(b[0:]), dport: port, vtag: binary.BigEndian.Uint32(b[4:]),
			typ: b[12], value: slices.Clone(b[16 : 12+l]), from: addr.Unmap()}, nil
	}
}

// serveSCTP answers one association at a time on sctpTargetPort: each
// chunk with its answer, each DATA with a SACK and the data reversed.
// It returns the sources it saw and its CRC count when stopped.
func serveSCTP(e *sctpEndpoint) (stop func() (sources []netip.AddrPort, badCRCs int)) {
	const serverTag = 0x5e7e0001
	var mu sync.Mutex
	var sources []netip.AddrPort
	done := make(chan struct{})
	go func() {
		defer close(done)
		tsn := uint32(100)
		var peerTag uint32 // the client's, from its INIT: every answer carries it
		for {
			c, err := e.next(sctpTargetPort, 30*time.Second)
			if err != nil {
				return
			}
			mu.Lock()
			sources = append(sources, netip.AddrPortFrom(c.from, c.sport))
			mu.Unlock()
			reply := func(typ uint8, vtag uint32, value []byte) {
				_ = e.send(c.from, sctpTargetPort, c.sport, vtag, typ, value)
			}
			switch c.typ {
			case bpftest.SCTPInit:
				if len(c.value) < 16 {
					continue
				}
				peerTag = binary.BigEndian.Uint32(c.value)
				ack := binary.BigEndian.AppendUint32(nil, serverTag)
				ack = binary.BigEndian.AppendUint32(ack, 65535)                        // a_rwnd
				ack = binary.BigEndian.AppendUint32(ack, 1<<16|1)                      // streams out, in
				ack = binary.BigEndian.AppendUint32(ack, tsn)                          // initial TSN
				ack = append(ack, 0, 7, 0, 12, 'c', 'o', 'o', 'k', 'i', 'e', '!', '!') // State Cookie
				reply(bpftest.SCTPInitAck, peerTag, ack)
			case bpftest.SCTPCookieEcho:
				reply(bpftest.SCTPCookieAck, peerTag, nil)
			case bpftest.SCTPData:
				if len(c.value) < 12 {
					continue
				}
				sack := append(slices.Clone(c.value[:4]), 0, 0, 0xff, 0xff, 0, 0, 0, 0) // cumulative TSN, a_rwnd, no gaps
				reply(3 /* SACK */, peerTag, sack)
				data := binary.BigEndian.AppendUint32(nil, tsn)
				tsn++
				data = append(data, c.value[4:12]...)
				user := slices.Clone(c.value[12:])
				slices.Reverse(user)
				reply(bpftest.SCTPData, peerTag, append(data, user...))
			case bpftest.SCTPShutdown:
				reply(bpftest.SCTPShutdownAck, peerTag, nil)
			}
		}
	}()
	return func() ([]netip.AddrPort, int) {
		e.conn.Close() // ends the read the server waits in
		<-done
		mu.Lock()
		defer mu.Unlock()
		return sources, e.badCRCs
	}
}

// clientTag is the client's verification tag: packets to the client carry
// it, packets to the server the server's.
const clientTag = 0xc11e0001

// associate runs one association from the client's endpoint to front:
// the handshake, DATA of each size both ways, the shutdown. Every answer
// must come from front, with the client's tag and a right CRC.
func associate(client *sctpEndpoint, front netip.AddrPort, sizes []int) error {
	expect := func(typ uint8) (sctpChunk, error) {
		c, err := client.next(sctpClientPort, 5*time.Second)
		if err != nil {
			return c, fmt.Errorf("waiting for chunk %d: %w (%d packets with a wrong CRC)", typ, err, client.badCRCs)
		}
		if got := netip.AddrPortFrom(c.from, c.sport); got != front || c.typ != typ || c.vtag != clientTag {
			return c, fmt.Errorf("chunk %d from %v with tag %#x, want chunk %d from %v with tag %#x", c.typ, got, c.vtag, typ, front, uint32(clientTag))
		}
		return c, nil
	}
	send := func(vtag uint32, typ uint8, value []byte) error {
		return client.send(front.Addr(), sctpClientPort, front.Port(), vtag, typ, value)
	}
	init := binary.BigEndian.AppendUint32(nil, clientTag)
	init = binary.BigEndian.AppendUint32(init, 65535)
	init = binary.BigEndian.AppendUint32(init, 1<<16|1)
	init = binary.BigEndian.AppendUint32(init, 1)
	if err := send(0, bpftest.SCTPInit, init); err != nil {
		return err
	}
	ack, err := expect(bpftest.SCTPInitAck)
	if err != nil {
		return err
	}
	serverTag := binary.BigEndian.Uint32(ack.value)
	if err := send(serverTag, bpftest.SCTPCookieEcho, ack.value[16:]); err != nil {
		return err
	}
	if _, err := expect(bpftest.SCTPCookieAck); err != nil {
		return err
	}
	for i, n := range sizes {
		user := make([]byte, n)
		for j := range user {
			user[j] = byte(i + j)
		}
		data := binary.BigEndian.AppendUint32(nil, uint32(1+i))
		data = append(data, 0, 0, 0, byte(i), 0, 0, 0, 0)
		if err := send(serverTag, bpftest.SCTPData, append(data, user...)); err != nil {
			return err
		}
		sack, err := expect(3)
		if err != nil {
			return err
		}
		if binary.BigEndian.Uint32(sack.value) != uint32(1+i) {
			return fmt.Errorf("SACK of TSN %d, want %d", binary.BigEndian.Uint32(sack.value), 1+i)
		}
		echo, err := expect(bpftest.SCTPData)
		if err != nil {
			return err
		}
		slices.Reverse(user)
		if !bytes.Equal(echo.value[12:], user) {
			return fmt.Errorf("%d bytes of DATA came back as %d different ones", n, len(echo.value)-12)
		}
	}
	if err := send(serverTag, bpftest.SCTPShutdown, binary.BigEndian.AppendUint32(nil, 100)); err != nil {
		return err
	}
	if _, err := expect(bpftest.SCTPShutdownAck); err != nil {
		return err
	}
	return send(serverTag, bpftest.SCTPShutdownComplete, nil)
}

// Real SCTP between two pods through a ClusterIP whose port differs from the
// backend's, in both families: every packet both ways is translated, and
// both ends find every CRC right, for DATA from 1 byte to MTU-sized. The
// backend sees the client's own address (a ClusterIP from a pod is not
// SNATed), on its own port.
func TestSCTPAssociationThroughClusterIP(t *testing.T) {
	d := newDP(t)
	topo := bpftest.NewTopology(t, d, "client", "server")
	topo.EnableIPv6(t)
	vip4 := netip.MustParseAddrPort(fmt.Sprintf("10.96.0.38:%d", sctpServicePort))
	vip6 := netip.MustParseAddrPort(fmt.Sprintf("[fd00:96::38]:%d", sctpServicePort))
	d.AddService(bpftest.Service{ID: 1, Front: vip4, Proto: protoSCTP,
		Backends: []bpftest.Backend{{AP: netip.AddrPortFrom(topo.PodIP["server"], sctpTargetPort), Local: true}}})
	d.AddService(bpftest.Service{ID: 2, Front: vip6, Proto: protoSCTP,
		Backends: []bpftest.Backend{{AP: netip.AddrPortFrom(topo.PodIP6["server"], sctpTargetPort), Local: true}}})

	for _, f := range []struct {
		name           string
		vip            netip.AddrPort
		client, server netip.Addr
	}{
		{"IPv4", vip4, topo.PodIP["client"], topo.PodIP["server"]},
		{"IPv6", vip6, topo.PodIP6["client"], topo.PodIP6["server"]},
	} {
		t.Run(f.name, func(t *testing.T) {
			stop := serveSCTP(listenSCTP(t, topo.Pods["server"], f.server))
			client := listenSCTP(t, topo.Pods["client"], f.client)
			err := associate(client, f.vip, []int{1, 3, 100, 1023, 1400})
			sources, serverBad := stop()
			if err != nil {
				logCounters(t, d)
				t.Fatal(err)
			}
			if serverBad != 0 || client.badCRCs != 0 {
				t.Fatalf("packets with a wrong CRC: %d at the server, %d at the client", serverBad, client.badCRCs)
			}
			want := netip.AddrPortFrom(f.client, sctpClientPort)
			if len(sources) == 0 || slices.ContainsFunc(sources, func(s netip.AddrPort) bool { return s != want }) {
				t.Fatalf("the server saw %v, want %v alone", sources, want)
			}
		})
	}
}
