// Command podnet is the CNI plugin. Exec'd by a container runtime with
// CNI_COMMAND set it runs one CNI verb; `podnet install` (a DaemonSet init
// container) copies it into the CNI bin dir and writes its conflist.
package main

import (
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/spf13/pflag"

	"github.com/podnet/podnet/dataplane/cli"
	"github.com/podnet/podnet/dataplane/cni"
	"github.com/podnet/podnet/dataplane/logging"
	"github.com/podnet/podnet/dataplane/nodeconfig"
	"github.com/podnet/podnet/dataplane/version"
)

func main() {
	if os.Getenv("CNI_COMMAND") != "" {
		skel.PluginMainFuncs(cni.Funcs(), cni.VersionInfo, "CNI plugin podnet "+version.String())
		return
	}
	os.Exit(command().Main(os.Args[1:], os.Stdout, os.Stderr))
}

// command is podnet's command line when no runtime runs it: install, or
// --version.
func command() cli.Command {
	var showVersion bool
	return cli.Command{
		Name: "podnet",
		Summary: fmt.Sprintf("the podnet CNI plugin. Exec'd by a container runtime with CNI_COMMAND set, it runs that CNI verb (CNI versions %v)",
			cni.VersionInfo.SupportedVersions()),
		Usage: "podnet --version",
		Subcommands: []cli.Subcommand{
			{Name: "install", Summary: "copy the plugin (and loopback, portmap) into the CNI bin dir and write its conflist", Run: runInstall},
		},
		Flags: func(fs *pflag.FlagSet) { fs.BoolVar(&showVersion, "version", false, "print the version and exit") },
		Run: func(stdout, stderr io.Writer) int {
			if showVersion {
				fmt.Fprintln(stdout, "podnet", version.String())
				return cli.ExitOK
			}
			fmt.Fprintln(stderr, "podnet: no CNI_COMMAND and no subcommand: a container runtime sets CNI_COMMAND; by hand, run podnet install (see podnet --help)")
			return cli.ExitUsage
		},
	}
}

// runInstall is `podnet install`.
func runInstall(args []string, stdout, stderr io.Writer) int {
	fs := pflag.NewFlagSet("podnet install", pflag.ContinueOnError)
	var o cni.InstallOptions
	fs.StringVar(&o.BinDir, "cni-bin-dir", "/opt/cni/bin", "directory to copy the plugin binary to")
	fs.StringVar(&o.ConfDir, "cni-conf-dir", "/etc/cni/net.d", "directory to write "+cni.ConflistName+" to")
	fs.StringVar(&o.ReferencePluginDir, "reference-plugins-dir", "", "where the CNI reference plugins "+strings.Join(cni.ReferencePlugins, " and ")+" are, installed when --cni-bin-dir lacks them (default: beside this binary)")
	fs.StringVar(&o.Bridge, "bridge", "", "bridge field of the conflist (plugin default "+cni.DefaultBridge+")")
	fs.StringVar(&o.NodeConfig, "node-config", "", "nodeConfig field of the conflist (plugin default "+nodeconfig.DefaultPath+")")
	fs.StringVar(&o.DataDir, "data-dir", "", "dataDir field of the conflist (plugin default "+cni.DefaultDataDir+")")
	fs.StringVar(&o.LogFile, "log-file", "", "logFile field of the conflist")
	fs.BoolVar(&o.MoveOthersAside, "move-others-aside", false, "rename other networks' configs that sort ahead of "+cni.ConflistName+" (appending "+cni.MovedAsideSuffix+"; without it install refuses them)")
	var logOpts logging.Options
	logOpts.AddFlags(fs)
	usage := "usage: podnet install [flags]\n\nCopies the plugin into --cni-bin-dir (with the reference plugins " + strings.Join(cni.ReferencePlugins, " and ") +
		" where the node has none)\nand writes --cni-conf-dir/" + cni.ConflistName + ", as the DaemonSet's init container does."
	if code, ok := cli.SubcommandFlags(fs, usage, args, stdout, stderr); !ok {
		return code
	}
	log, err := logOpts.New(stderr)
	if err != nil {
		fmt.Fprintf(stderr, "podnet install: %v\n", err)
		return cli.ExitUsage
	}
	if fs.Changed("log-format") {
		o.LogFormat = logOpts.Format // the plugin logs as install does
	}
	changed, err := cni.Install(o)
	if err != nil {
		log.Error("podnet install failed", "err", err)
		return cli.ExitError
	}
	for _, p := range changed {
		if old, ok := strings.CutSuffix(p, cni.MovedAsideSuffix); ok {
			log.Warn("moved another network's CNI config aside", "from", old, "to", p)
			continue
		}
		log.Info("installed", "path", p)
	}
	if len(changed) == 0 {
		log.Info("already installed, nothing changed")
	}
	return cli.ExitOK
}
