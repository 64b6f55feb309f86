// Command podnet-lab brings the lab cluster up, shows what works in it and
// takes it down again (`make demo`).
//
//	podnet-lab demo [--keep]   build the lab, run the demo steps, tear down
//	                           (--keep: leave it up for `podnet-lab down`)
//	podnet-lab down            remove every kept lab (and stale ones)
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/pflag"

	"github.com/podnet/podnet/dataplane/version"
	"github.com/podnet/podnet/e2e/lab"
)

const usage = `usage:
  podnet-lab demo [--keep] [--bin-dir DIR]   build the lab, show what works, tear it down
  podnet-lab down                            remove every lab kept with --keep
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
	var err error
	switch os.Args[1] {
	case "demo":
		err = demoCmd(ctx, os.Args[2:])
	case "down":
		err = downCmd(os.Args[2:])
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
	if err := fs.Parse(args); err != nil {
		return err
	}
	return runDemo(ctx, os.Stdout, demoOptions{keep: *keep, binDir: *binDir})
}

func downCmd(args []string) error {
	fs := pflag.NewFlagSet("down", pflag.ContinueOnError)
	if err := fs.Parse(args); err != nil {
		return err
	}
	removed, err := lab.Down(func(format string, args ...any) { fmt.Printf(format+"\n", args...) })
	for _, p := range removed {
		fmt.Printf("removed lab %s\n", p)
	}
	if len(removed) == 0 && err == nil {
		fmt.Println("no kept labs")
	}
	return err
}
