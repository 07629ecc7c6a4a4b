package bpftest

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// ClientResult counts what RunClients' connections did.
type ClientResult struct {
	OK, Failed int
	// NoLocalPort counts the dials the client's own kernel refused for
	// want of a local port (EADDRNOTAVAIL: every port toward that address
	// in TIME_WAIT, a client that closes first); no packet left for them,
	// and they are not in Failed.
	NoLocalPort int
	FirstErr    error
	Elapsed     time.Duration
}

// Rate is successful connections per second.
func (r ClientResult) Rate() float64 { return float64(r.OK) / r.Elapsed.Seconds() }

// RunClients runs workers in ns, each connecting to the targets in turn and
// reading the answer to its end (servers that close first: ServeCloseFirst),
// until the duration is over. A connection fails when it cannot connect,
// read or get a whole line within 3 s.
func RunClients(ns *NetNS, targets []string, workers int, duration time.Duration) ClientResult {
	return runClients(ns, targets, workers, duration, connectAndRead)
}

// RunClientsClosingFirst is RunClients with clients that close first: each
// sends a line, reads the one line of answer and closes, against servers
// that answer each line and close once the client has (ServeTCP). The
// client then holds each tuple in TIME_WAIT, and its kernel does not reuse
// a port toward the same address for 60 s.
func RunClientsClosingFirst(ns *NetNS, targets []string, workers int, duration time.Duration) ClientResult {
	return runClients(ns, targets, workers, duration, connectAskClose)
}

func runClients(ns *NetNS, targets []string, workers int, duration time.Duration, connect func(target string) error) ClientResult {
	var ok, failed, noPort atomic.Int64
	var firstErr atomic.Value
	var wg sync.WaitGroup
	start := time.Now()
	deadline := start.Add(duration)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := ns.Do(func() error { // one thread in the namespace per worker
				for i := w; time.Now().Before(deadline); i++ {
					err := connect(targets[i%len(targets)])
					if errors.Is(err, syscall.EADDRNOTAVAIL) {
						noPort.Add(1)
						continue
					}
					if err != nil {
						failed.Add(1)
						firstErr.CompareAndSwap(nil, err)
						continue
					}
					ok.Add(1)
				}
				return nil
			})
			if err != nil {
				firstErr.CompareAndSwap(nil, err)
			}
		}()
	}
	wg.Wait()
	r := ClientResult{OK: int(ok.Load()), Failed: int(failed.Load()), NoLocalPort: int(noPort.Load()), Elapsed: time.Since(start)}
	r.FirstErr, _ = firstErr.Load().(error)
	return r
}

// clientTimeout bounds a client's connect, and then its exchange.
const clientTimeout = 3 * time.Second

// dial connects to target, an IPv4 or IPv6 literal, in its own family, with
// a deadline for what follows.
func dial(target string) (net.Conn, error) {
	c, err := net.DialTimeout("tcp", target, clientTimeout)
	if err != nil {
		return nil, err
	}
	c.SetDeadline(time.Now().Add(clientTimeout))
	return c, nil
}

// connectAndRead dials target and reads the answer to its end: the server
// closes first, the client after it.
func connectAndRead(target string) error {
	c, err := dial(target)
	if err != nil {
		return err
	}
	defer c.Close()
	answer, err := io.ReadAll(c)
	if err != nil {
		return fmt.Errorf("%s: %w", target, err)
	}
	if !bytes.HasSuffix(answer, []byte("\n")) {
		return fmt.Errorf("%s: answer %q", target, answer)
	}
	return nil
}

// connectAskClose dials target, sends a line, reads the answer's line and
// closes first.
func connectAskClose(target string) error {
	c, err := dial(target)
	if err != nil {
		return err
	}
	defer c.Close()
	if _, err := io.WriteString(c, "x\n"); err != nil {
		return fmt.Errorf("%s: %w", target, err)
	}
	answer, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return fmt.Errorf("%s: answer %q: %w", target, answer, err)
	}
	return nil
}
