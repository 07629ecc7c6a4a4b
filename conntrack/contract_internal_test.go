package conntrack

import (
	"testing"
	"time"

	"github.com/sluice-net/sluice/gen/bpftest"
)

// The scanner reads the TCP flags the datapath records (bpf/include/parse.h)
// and must keep a flow whose server closed first at least as long as the
// datapath keeps new flows off its tuple (TCP_TIME_WAIT_NS).
func TestScannerMatchesTheCHeaders(t *testing.T) {
	for name, goValue := range map[string]uint64{
		"TCP_FLAG_FIN": tcpFIN, "TCP_FLAG_SYN": tcpSYN, "TCP_FLAG_RST": tcpRST, "TCP_FLAG_ACK": tcpACK,
	} {
		if c := bpftest.Define(t, name); c != goValue {
			t.Errorf("%s is %#x in C, %#x in Go", name, c, goValue)
		}
	}
	if tw := time.Duration(bpftest.Define(t, "TCP_TIME_WAIT_NS")); DefaultTimeouts().TCPServerTimeWait < tw {
		t.Errorf("the scanner forgets server-closed flows after %v, before the datapath's TIME_WAIT rule (%v) ends", DefaultTimeouts().TCPServerTimeWait, tw)
	}
}
