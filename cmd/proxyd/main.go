// Command proxyd is podnet's per-node agent and service proxy.
package main

import (
	"fmt"
	"os"

	"github.com/spf13/pflag"

	"github.com/podnet/podnet/dataplane/version"
)

func main() {
	fs := pflag.NewFlagSet("proxyd", pflag.ContinueOnError)
	showVersion := fs.Bool("version", false, "print the version and exit")
	if err := fs.Parse(os.Args[1:]); err != nil {
		if err == pflag.ErrHelp {
			os.Exit(0)
		}
		os.Exit(2)
	}
	if *showVersion {
		fmt.Println("proxyd", version.String())
		return
	}
	fmt.Fprintln(os.Stderr, "proxyd: not implemented yet")
	os.Exit(1)
}
