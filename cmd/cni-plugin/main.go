// Command podnet is the CNI plugin. Exec'd by a container runtime with
// CNI_COMMAND set it runs one CNI verb; run by hand it installs itself.
package main

import (
	"fmt"
	"os"

	"github.com/spf13/pflag"

	"github.com/podnet/podnet/dataplane/version"
)

func main() {
	fs := pflag.NewFlagSet("podnet", pflag.ContinueOnError)
	showVersion := fs.Bool("version", false, "print the version and exit")
	if err := fs.Parse(os.Args[1:]); err != nil {
		if err == pflag.ErrHelp {
			os.Exit(0)
		}
		os.Exit(2)
	}
	if *showVersion {
		fmt.Println("podnet", version.String())
		return
	}
	fmt.Fprintln(os.Stderr, "podnet: not implemented yet")
	os.Exit(1)
}
