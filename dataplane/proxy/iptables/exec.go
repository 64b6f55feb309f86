package iptables

import "github.com/podnet/podnet/dataplane/ipt"

// Backends of the iptables command.
const (
	BackendNFT    = ipt.BackendNFT
	BackendLegacy = ipt.BackendLegacy
)

// ExecRunner runs the iptables-<backend> commands: the one runner podnet
// shares between the Service proxy and the node's own chains.
type ExecRunner = ipt.Runner

var _ Runner = ExecRunner{}

// DetectBackend picks the iptables backend the node already uses (see
// ipt.Detect).
func DetectBackend() string { return ipt.Detect() }
