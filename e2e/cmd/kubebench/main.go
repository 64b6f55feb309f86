// Command kubebench runs a command against a real API server holding a
// cluster of a given size: it starts the e2e control plane (etcd and
// kube-apiserver in a network namespace of their own), seeds the
// Services into its etcd (apiserver.SeedServices: creating them through
// the API costs the API server O(n²)), writes an admin kubeconfig, runs the command inside that
// namespace and removes everything again. scripts/bench-dns.sh measures
// dnsd and CoreDNS this way.
//
//	kubebench [--services N] [--endpoints M] [--namespace NS] -- COMMAND [ARG...]
//
// The command runs in the control plane's namespace (where the API server
// listens on 127.0.0.1:6443) and cgroup, with
//
//	KUBECONFIG       the admin kubeconfig (context "lab")
//	BENCH_SERVICES   N, named svc-00000 … in namespace BENCH_NAMESPACE
//	BENCH_NAMESPACE  NS
//
// Its exit status is kubebench's. Needs root and $PODNET_KUBE_APISERVER
// (make apiserver builds it).
package main

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/spf13/pflag"

	"github.com/podnet/podnet/e2e/apiserver"
	"github.com/podnet/podnet/e2e/lab"
)

func main() {
	fs := pflag.NewFlagSet("kubebench", pflag.ContinueOnError)
	var o options
	fs.IntVar(&o.services, "services", 1000, "Services to create (besides default/kubernetes)")
	fs.IntVar(&o.endpoints, "endpoints", 3, "ready endpoints in each Service's EndpointSlice")
	fs.StringVar(&o.namespace, "namespace", "bench", "namespace of the Services")
	if err := fs.Parse(os.Args[1:]); err != nil {
		fmt.Fprintf(os.Stderr, "kubebench: %v\n", err)
		os.Exit(2)
	}
	if fs.NArg() == 0 {
		fmt.Fprintln(os.Stderr, "usage: kubebench [--services N] [--endpoints M] [--namespace NS] -- COMMAND [ARG...]")
		os.Exit(2)
	}
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "kubebench: needs root: the control plane runs in a network namespace and cgroup of its own")
		os.Exit(1)
	}
	// SIGINT/SIGTERM end the command and tear the control plane down.
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	o.command = fs.Args()
	code, err := run(ctx, o)
	if err != nil {
		fmt.Fprintf(os.Stderr, "kubebench: %v\n", err)
		if code == 0 {
			code = 1
		}
	}
	os.Exit(code)
}

// options are kubebench's flags and the command to run.
type options struct {
	services, endpoints int
	namespace           string
	command             []string
}

func run(ctx context.Context, o options) (code int, err error) {
	bin, err := apiserver.Binary()
	if err != nil {
		return 1, err
	}
	logf := func(format string, args ...any) { fmt.Fprintf(os.Stderr, "kubebench: "+format+"\n", args...) }
	start := time.Now()
	cp, err := lab.NewControlPlane(ctx, nil)
	if err != nil {
		return 1, err
	}
	defer func() { err = errors.Join(err, cp.Close()) }()
	// etcd fsyncs every write; on tmpfs that costs nothing.
	shm, err := os.MkdirTemp("/dev/shm", "podnet-etcd-")
	if err != nil {
		return 1, err
	}
	defer os.RemoveAll(shm)
	srv, err := apiserver.Start(ctx, apiserver.Options{
		NSPath:  cp.NSPath(),
		Start:   func(name string, args ...string) (apiserver.Process, error) { return cp.Host.Start(name, args...) },
		Dir:     filepath.Join(cp.Dir, "apiserver"),
		EtcdDir: filepath.Join(shm, "etcd"),
		Binary:  bin,
	})
	if err != nil {
		return 1, err
	}
	defer func() { err = errors.Join(err, srv.Close()) }()
	logf("control plane up in %v", time.Since(start).Round(time.Millisecond))

	admin, err := srv.Client(apiserver.Admin)
	if err != nil {
		return 1, err
	}
	start = time.Now()
	if err := srv.SeedServices(ctx, admin, o.namespace, o.services, o.endpoints); err != nil {
		return 1, fmt.Errorf("create Services: %w\n%s", err, srv.Logs())
	}
	logf("seeded %d Services with %d endpoints each in %v", o.services, o.endpoints, time.Since(start).Round(time.Second))
	kubeconfig := filepath.Join(cp.Dir, "admin.kubeconfig")
	if err := srv.WriteKubeconfig(kubeconfig, apiserver.Admin, netip.MustParseAddr("127.0.0.1")); err != nil {
		return 1, err
	}

	cg, err := os.Open(cp.Host.Cgroup)
	if err != nil {
		return 1, err
	}
	defer cg.Close()
	// In the control plane's cgroup from the first instruction: closing the
	// control plane kills whatever the command left running.
	cmd := exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", cp.Host.NS}, o.command...)...)
	cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: int(cg.Fd()), Pdeathsig: syscall.SIGKILL}
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 10 * time.Second
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.Env = append(os.Environ(),
		"KUBECONFIG="+kubeconfig,
		"BENCH_SERVICES="+strconv.Itoa(o.services),
		"BENCH_NAMESPACE="+o.namespace,
	)
	if err := cmd.Run(); err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) && ee.ExitCode() > 0 {
			return ee.ExitCode(), nil
		}
		return 1, fmt.Errorf("%s: %w", o.command[0], err)
	}
	return 0, nil
}
