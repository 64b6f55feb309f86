package main

import (
	"github.com/podnet/podnet/dataplane/conntrack"
	"github.com/podnet/podnet/dataplane/proxy"
	// The Service proxy modes proxyd offers: each registers itself.
	_ "github.com/podnet/podnet/dataplane/proxy/ebpf"
	_ "github.com/podnet/podnet/dataplane/proxy/iptables"
	_ "github.com/podnet/podnet/dataplane/proxy/nftables"
)

// modes are the Service proxy modes proxyd offers, the default first.
var modes = proxy.Registered()

// conntrackNetlink adapts the conntrack package to the proxy's interface.
type conntrackNetlink struct{}

func (conntrackNetlink) Delete(fs []proxy.ConntrackFilter) error {
	cfs := make([]conntrack.Filter, len(fs))
	for i, f := range fs {
		cfs[i] = conntrack.Filter{Protocol: string(f.Protocol), Family: f.Family, OrigDst: f.OrigDst, OrigDstPort: f.OrigDstPort, ReplySrc: f.ReplySrc, ReplySrcPort: f.ReplySrcPort}
	}
	_, err := conntrack.Delete(cfs...)
	return err
}
