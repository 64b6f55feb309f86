// Command podnet-lab brings the lab cluster up, shows what works in it and
// takes it down again (`make demo`).
//
//	podnet-lab demo [--keep] [--proxy-mode M]
//	                           build the lab, run the demo steps, tear down
//	                           (--keep: leave it up for `podnet-lab down`)
//	podnet-lab down [PREFIX...] remove the kept labs (all, or those named) and
//	                           stale ones
//
// The lab also runs it inside pods and nodes:
//
//	podnet-lab serve --name NAME [--http ADDR] [--tcp ADDR] [--udp ADDR]
//	podnet-lab probe [--timeout D] http|tcp|udp HOST:PORT
//	podnet-lab rr [--duration D] [--slice D] HOST:PORT...
//	podnet-lab connect HOST:PORT...
//	podnet-lab udp-ask HOST:PORT
//	podnet-lab stream [--duration D] [--slice D] HOST:PORT...
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/pflag"

	"github.com/podnet/podnet/dataplane/version"
	"github.com/podnet/podnet/e2e/lab"
)

const usage = `usage:
  podnet-lab demo [--keep] [--logs] [--proxy-mode iptables|ebpf] [--bin-dir DIR]
                                             build the lab, show what works, tear it down
  podnet-lab down [PREFIX...]                remove the labs kept with --keep (all, or those named)

run by the lab inside pods and nodes:
  podnet-lab serve --name NAME [--http ADDR]... [--tcp ADDR]... [--udp ADDR]...
                                             echo server: answers "NAME CLIENT_IP:PORT"
  podnet-lab probe [--timeout 2s] http|tcp|udp HOST:PORT
                                             prints the echo server's answer
  podnet-lab rr [--duration 5s] [--slice 250ms] HOST:PORT...
                                             TCP_RR against echo servers' TCP ports: one byte
                                             each way over one connection to each, taking
                                             turns; prints "HOST:PORT N round trips in Ss" each
  podnet-lab connect HOST:PORT...            one TCP connect per line read (the address's index),
                                             answering "ok NANOSECONDS" or "err MESSAGE"
  podnet-lab udp-ask HOST:PORT               one UDP query per line read, all from one connected
                                             socket (dialled again from its port if it fails),
                                             answering "ok NAME", "silent" or "redial MESSAGE"
  podnet-lab stream [--duration 5s] [--slice 250ms] HOST:PORT...
                                             bulk TCP against echo servers' TCP ports, one
                                             connection each, taking turns; prints
                                             "HOST:PORT N bytes in Ss" each (N echoed back)
`

func main() {
	if len(os.Args) < 2 {
		fmt.Fprint(os.Stderr, usage)
		os.Exit(2)
	}
	// SIGINT/SIGTERM cancel the context; every command then tears down what
	// it built before it exits.
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if (os.Args[1] == "demo" || os.Args[1] == "down") && os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "podnet-lab: needs root: the lab creates network namespaces, links and cgroups")
		os.Exit(1)
	}
	var err error
	switch os.Args[1] {
	case "demo":
		err = demoCmd(ctx, os.Args[2:])
	case "down":
		err = downCmd(os.Args[2:])
	case "serve":
		err = serveCmd(ctx, os.Args[2:])
	case "probe":
		err = probeCmd(ctx, os.Args[2:])
	case "rr":
		err = rrCmd(ctx, os.Args[2:])
	case "stream":
		err = streamCmd(ctx, os.Args[2:])
	case "connect":
		err = connectCmd(os.Args[2:])
	case "udp-ask":
		if len(os.Args) != 3 {
			err = errors.New("udp-ask: want HOST:PORT")
			break
		}
		err = lab.ServeUDPAsks(os.Stdin, os.Stdout, os.Args[2])
	case "--version", "version":
		fmt.Println("podnet-lab", version.String())
	case "-h", "--help", "help":
		fmt.Print(usage)
	default:
		fmt.Fprintf(os.Stderr, "podnet-lab: unknown command %q\n%s", os.Args[1], usage)
		os.Exit(2)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "podnet-lab:", err)
		os.Exit(1)
	}
}

func demoCmd(ctx context.Context, args []string) error {
	fs := pflag.NewFlagSet("demo", pflag.ContinueOnError)
	keep := fs.Bool("keep", false, "leave the lab up; remove it later with `podnet-lab down`")
	binDir := fs.String("bin-dir", "", "directory with podnet, proxyd, dnsd (default: $PODNET_BIN, else this binary's directory)")
	proxyMode := fs.String("proxy-mode", "iptables", "proxyd's Service proxy: iptables or ebpf")
	logs := fs.Bool("logs", false, "after a failed step, print what every process of the lab said")
	if err := fs.Parse(args); err != nil {
		return err
	}
	return runDemo(ctx, os.Stdout, demoOptions{keep: *keep, binDir: *binDir, proxyMode: *proxyMode, logs: *logs})
}

func downCmd(args []string) error {
	fs := pflag.NewFlagSet("down", pflag.ContinueOnError)
	if err := fs.Parse(args); err != nil {
		return err
	}
	removed, err := lab.Down(func(format string, args ...any) { fmt.Printf(format+"\n", args...) }, fs.Args()...)
	for _, p := range removed {
		fmt.Printf("removed lab %s\n", p)
	}
	if len(removed) == 0 && err == nil {
		fmt.Println("no kept labs")
	}
	return err
}

func serveCmd(ctx context.Context, args []string) error {
	fs := pflag.NewFlagSet("serve", pflag.ContinueOnError)
	var o lab.EchoOptions
	fs.StringVar(&o.Name, "name", "", "name reported in every answer (default: the host name)")
	fs.StringArrayVar(&o.HTTP, "http", nil, "HTTP listen address, e.g. :8080 (repeatable)")
	fs.StringArrayVar(&o.TCP, "tcp", nil, "TCP listen address (repeatable)")
	fs.StringArrayVar(&o.UDP, "udp", nil, "UDP listen address (repeatable)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if o.Name == "" {
		o.Name, _ = os.Hostname()
	}
	return lab.ServeEcho(ctx, o, func() { fmt.Println(lab.EchoReady) })
}

func probeCmd(ctx context.Context, args []string) error {
	fs := pflag.NewFlagSet("probe", pflag.ContinueOnError)
	timeout := fs.Duration("timeout", lab.ProbeTimeout, "give up after this long")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 2 {
		return errors.New("probe: want PROTO HOST:PORT")
	}
	if *timeout <= 0 || *timeout > time.Minute {
		return fmt.Errorf("probe: --timeout %v: want 0 < timeout <= 1m", *timeout)
	}
	answer, err := lab.Probe(ctx, fs.Arg(0), fs.Arg(1), *timeout)
	if err != nil {
		return err
	}
	fmt.Println(answer)
	return nil
}

// turnFlags parses the flags rr and stream share: how long in all per
// address, and the turn each connection gets.
func turnFlags(cmd string, args []string, slice time.Duration) (addrs []string, d, s time.Duration, err error) {
	fs := pflag.NewFlagSet(cmd, pflag.ContinueOnError)
	fd := fs.Duration("duration", 5*time.Second, "how long to run against each address")
	fslice := fs.Duration("slice", slice, "how long one connection runs before the next one's turn")
	if err := fs.Parse(args); err != nil {
		return nil, 0, 0, err
	}
	if fs.NArg() == 0 {
		return nil, 0, 0, fmt.Errorf("%s: want one or more HOST:PORT", cmd)
	}
	if *fd <= 0 || *fd > 5*time.Minute {
		return nil, 0, 0, fmt.Errorf("%s: --duration %v: want 0 < duration <= 5m", cmd, *fd)
	}
	if *fslice <= 0 || *fslice > *fd {
		return nil, 0, 0, fmt.Errorf("%s: --slice %v: want 0 < slice <= duration", cmd, *fslice)
	}
	return fs.Args(), *fd, *fslice, nil
}

func streamCmd(ctx context.Context, args []string) error {
	addrs, d, slice, err := turnFlags("stream", args, 250*time.Millisecond)
	if err != nil {
		return err
	}
	n, took, err := lab.Stream(ctx, addrs, d, slice)
	if err != nil {
		return err
	}
	for i, addr := range addrs {
		fmt.Printf("%s %d bytes in %.3fs\n", addr, n[i], took[i].Seconds())
	}
	return nil
}

func rrCmd(ctx context.Context, args []string) error {
	addrs, d, slice, err := turnFlags("rr", args, 250*time.Millisecond)
	if err != nil {
		return err
	}
	n, took, err := lab.RequestResponse(ctx, addrs, d, slice)
	if err != nil {
		return err
	}
	for i, addr := range addrs {
		fmt.Printf("%s %d round trips in %.3fs\n", addr, n[i], took[i].Seconds())
	}
	return nil
}

func connectCmd(args []string) error {
	fs := pflag.NewFlagSet("connect", pflag.ContinueOnError)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() == 0 {
		return errors.New("connect: want one or more HOST:PORT")
	}
	return lab.ServeConnects(os.Stdin, os.Stdout, fs.Args())
}
