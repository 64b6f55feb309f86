package main

import (
	"github.com/podnet/podnet/dataplane/conntrack"
	"github.com/podnet/podnet/dataplane/proxy"
	"github.com/podnet/podnet/dataplane/proxy/iptables"
)

// modes are the Service proxy modes proxyd offers, the default first.
var modes = proxy.Modes{iptables.Mode, proxy.None}

// conntrackCLI adapts the conntrack package to the proxy's interface.
type conntrackCLI struct{}

func (conntrackCLI) DeleteUDP(f proxy.ConntrackFilter) error {
	_, err := conntrack.Delete(conntrack.Filter{Protocol: "udp", OrigDst: f.OrigDst, OrigDstPort: f.OrigDstPort, ReplySrc: f.ReplySrc})
	return err
}
