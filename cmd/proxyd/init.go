package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"strings"

	"github.com/spf13/pflag"

	"github.com/podnet/podnet/dataplane/cli"
	"github.com/podnet/podnet/dataplane/hostnet"
	"github.com/podnet/podnet/dataplane/ipfamily"
	"github.com/podnet/podnet/dataplane/podcidr"
)

// runInit is `proxyd init`: it sets the kernel settings proxyd needs (IP
// forwarding, br_netfilter and bridged traffic through iptables) and exits.
// It is meant for a privileged init container, so that proxyd itself can
// run with the read-only /proc/sys every unprivileged container gets: it
// then only reads them, and says so clearly if one was changed back.
func runInit(args []string, stdout, stderr io.Writer) int {
	fs := pflag.NewFlagSet("proxyd init", pflag.ContinueOnError)
	var ct hostnet.Conntrack
	registerConntrack(fs, &ct)
	clusterCIDR := fs.String("cluster-cidr", "10.244.0.0/16", "the cluster CIDRs, as proxyd takes them: the sysctls of each of their families are set")
	usage := "usage: proxyd init [flags]\n\nSets, for each family of --cluster-cidr, IP forwarding (net.ipv4.ip_forward=1, net.ipv6.conf.all.forwarding=1)\nand br_netfilter's hook (net.bridge.bridge-nf-call-iptables=1, -ip6tables=1; loading br_netfilter)\nin this network namespace, and the conntrack settings its flags give, then exits;\nfor a privileged init container before proxyd."
	if code, ok := cli.SubcommandFlags(fs, usage, args, stdout, stderr); !ok {
		return code
	}
	if err := ct.Validate(); err != nil {
		fmt.Fprintf(stderr, "proxyd init: %v\n", err)
		return cli.ExitUsage
	}
	cidrs, err := ipfamily.ParsePrefixes(*clusterCIDR)
	if err != nil {
		fmt.Fprintf(stderr, "proxyd init: --cluster-cidr: %v\n", err)
		return cli.ExitUsage
	}
	var fams []ipfamily.Family
	var set []string
	for _, p := range cidrs {
		f := ipfamily.OfPrefix(p)
		fams = append(fams, f)
		fwd, nf := hostnet.Sysctls(f)
		set = append(set, fwd+"=1", nf+"=1")
	}
	if err := errors.Join(hostnet.EnsureSysctls(hostnet.ProcSysctl{}, hostnet.ExecModprobe, fams...),
		hostnet.EnsureConntrack(hostnet.ProcSysctl{}, ct, runtime.NumCPU())); err != nil {
		fmt.Fprintf(stderr, "proxyd init: %v\n", err)
		return cli.ExitError
	}
	fmt.Fprintln(stdout, "proxyd init: "+strings.ReplaceAll(strings.Join(set, " "), "/", "."))
	return cli.ExitOK
}

// claimNamespace is --claim-namespace's default: the pod's own namespace,
// which deploy/'s DaemonSet passes in through the downward API, so the
// claims live where its Role lets it write Leases.
func claimNamespace() string {
	if ns := os.Getenv("POD_NAMESPACE"); ns != "" {
		return ns
	}
	return podcidr.DefaultNamespace
}
