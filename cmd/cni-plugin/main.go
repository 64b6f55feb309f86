// Command podnet is the CNI plugin. Exec'd by a container runtime with
// CNI_COMMAND set it runs one CNI verb; `podnet install` (a DaemonSet init
// container) copies it into the CNI bin dir and writes its conflist.
package main

import (
	"fmt"
	"os"
	"strings"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/spf13/pflag"

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
	os.Exit(runCLI(os.Args[1:]))
}

func runCLI(args []string) int {
	fs := pflag.NewFlagSet("podnet", pflag.ContinueOnError)
	showVersion := fs.Bool("version", false, "print the version and exit")
	var o cni.InstallOptions
	fs.StringVar(&o.BinDir, "cni-bin-dir", "/opt/cni/bin", "install: directory to copy the plugin binary to")
	fs.StringVar(&o.ConfDir, "cni-conf-dir", "/etc/cni/net.d", "install: directory to write "+cni.ConflistName+" to")
	fs.StringVar(&o.ReferencePluginDir, "reference-plugins-dir", "", "install: where the CNI reference plugins "+strings.Join(cni.ReferencePlugins, " and ")+" are, installed when --cni-bin-dir lacks them (default: beside this binary)")
	fs.StringVar(&o.Bridge, "bridge", "", "install: bridge field of the conflist (plugin default "+cni.DefaultBridge+")")
	fs.StringVar(&o.NodeConfig, "node-config", "", "install: nodeConfig field of the conflist (plugin default "+nodeconfig.DefaultPath+")")
	fs.StringVar(&o.DataDir, "data-dir", "", "install: dataDir field of the conflist (plugin default "+cni.DefaultDataDir+")")
	fs.StringVar(&o.LogFile, "log-file", "", "install: logFile field of the conflist")
	var logOpts logging.Options
	logOpts.AddFlags(fs)
	fs.Usage = func() {
		fmt.Fprintf(os.Stderr, "podnet %s: the podnet CNI plugin.\n\n", version.String())
		fmt.Fprintln(os.Stderr, "Exec'd by a container runtime with CNI_COMMAND set, it runs that CNI verb")
		fmt.Fprintf(os.Stderr, "(CNI versions %v).\n\nUsage:\n  podnet install [flags]   copy the plugin (and loopback, portmap) and write its conflist\n  podnet --version\n\nFlags:\n", cni.VersionInfo.SupportedVersions())
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if err == pflag.ErrHelp {
			return 0
		}
		fmt.Fprintf(os.Stderr, "podnet: %v (see podnet --help)\n", err)
		return 2
	}
	if *showVersion {
		fmt.Println("podnet", version.String())
		return 0
	}
	log, err := logOpts.New(os.Stderr)
	if err != nil {
		fmt.Fprintf(os.Stderr, "podnet: %v\n", err)
		return 2
	}
	switch fs.Arg(0) {
	case "install":
		if fs.Changed("log-format") {
			o.LogFormat = logOpts.Format // the plugin logs as install does
		}
		changed, err := cni.Install(o)
		if err != nil {
			log.Error("podnet install failed", "err", err)
			return 1
		}
		for _, p := range changed {
			log.Info("installed", "path", p)
		}
		if len(changed) == 0 {
			log.Info("already installed, nothing changed")
		}
		return 0
	case "":
		fs.Usage()
		return 2
	default:
		fmt.Fprintf(os.Stderr, "podnet: unknown command %q\n", fs.Arg(0))
		fs.Usage()
		return 2
	}
}
