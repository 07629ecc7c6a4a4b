// Package conntrack keeps the datapath's conntrack table healthy: a Scanner
// walks it periodically and deletes flows that expired or whose NAT went stale,
// always a forward entry together with its reverse entry; FlushBackends removes
// the UDP flows of backends that left their service right after a sync; Flow
// decodes an entry pair for people; an Adopter writes connections another
// proxy translated (netfilter's NAT, read with package conntrack/netfilter)
// into the table, so the datapath carries them on when that proxy leaves.
//
// Established TCP connections and SCTP associations to a backend that left its
// service are kept until they end or expire (graceful termination, as with
// kube-proxy): the stale-NAT check applies to the other protocols only, and
// FlushBackends to UDP only.
package conntrack
