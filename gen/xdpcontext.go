package gen

// XDPContext is struct xdp_md as BPF_PROG_TEST_RUN takes it for an XDP
// program: DataEnd is the frame's length (Data and DataMeta stay 0), and
// IngressIfindex the interface the frame arrives by, which the program's
// FIB lookups and redirects see, and through which live-frames mode
// (BPF_F_TEST_XDP_LIVE_FRAMES) sends what the program returns XDP_TX for.
type XDPContext struct {
	Data, DataEnd, DataMeta, IngressIfindex, RxQueueIndex, EgressIfindex uint32
}
