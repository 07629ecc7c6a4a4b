package nat

// The route lookup of the internalTrafficPolicy Local NodePort expansion.

import "net/netip"

// RouteLookup tells which node an endpoint IP is on: that node's IP, or false
// when the routes do not know it yet.
type RouteLookup func(endpoint netip.Addr) (nodeIP netip.Addr, ok bool)

// RoutesChanged re-checks endpoints whose node was unknown; when one resolves,
// its service is planned again at the next Apply and Options.Trigger is called.
func (s *Syncer) RoutesChanged() {
	if s.opts.Routes == nil {
		return
	}
	s.mu.Lock()
	resolved := false
	for name, p := range s.services {
		for _, ip := range p.routeMisses {
			if _, ok := s.opts.Routes(ip); ok {
				s.replan[name] = true
				resolved = true
				break
			}
		}
	}
	s.mu.Unlock()
	if resolved && s.opts.Trigger != nil {
		s.opts.Trigger()
	}
}
