// Package policy compiles an endpoint's network policy into BPF programs that
// the datapath tail-calls for each new flow, so a decision costs a few
// instructions per rule and nothing is interpreted per packet. Evaluate is
// the reference evaluator with the same semantics, used by the tests.
//
// Semantics: tiers are evaluated in order; in a tier, policies and their
// rules in order. The first rule that matches decides: Allow and Deny end the
// evaluation, Pass skips to the next tier, Log counts the packet and goes on.
// A tier in which no rule decided ends with its default action (Deny, or Pass
// to the next tier). After the last tier the packet is denied. An endpoint
// without tiers is not subject to policy.
//
// A rule matches when all of its conditions do; a condition with a list
// matches when any element does; Not* inverts a condition. Port conditions
// match only TCP and UDP packets, ICMP conditions only ICMP packets.
package policy
