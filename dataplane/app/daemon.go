package app

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/spf13/pflag"

	"github.com/podnet/podnet/dataplane/cli"
	"github.com/podnet/podnet/dataplane/logging"
	"github.com/podnet/podnet/dataplane/version"
)

// Daemon is the skeleton of podnet's long-running programs: its command
// line (subcommands, --version, -v and --log-format beside the daemon's
// own flags), its logger (client-go's klog through it), its health
// endpoint (Health), and a run that ends on SIGINT or SIGTERM.
type Daemon struct {
	Name, Summary string
	Subcommands   []cli.Subcommand
	// Flags registers the daemon's own flags.
	Flags func(*pflag.FlagSet)
	// Setup checks the parsed flags and returns what to run; its error is
	// a usage error (exit 2), naming the flag. It must start nothing.
	Setup func(log *slog.Logger) (Run, error)
}

// Main runs the daemon's command line: a subcommand, --help, --version,
// or the daemon until a signal; it returns the exit code.
func (d Daemon) Main(args []string, stdout, stderr io.Writer) int {
	var showVersion bool
	var logOpts logging.Options
	return cli.Command{
		Name: d.Name, Summary: d.Summary, Subcommands: d.Subcommands,
		Flags: func(fs *pflag.FlagSet) {
			d.Flags(fs)
			logOpts.AddFlags(fs)
			fs.BoolVar(&showVersion, "version", false, "print the version and exit")
		},
		Run: func(stdout, stderr io.Writer) int {
			if showVersion {
				fmt.Fprintln(stdout, d.Name, version.String())
				return cli.ExitOK
			}
			log, err := logOpts.New(stderr)
			if err != nil {
				fmt.Fprintf(stderr, "%s: %v\n", d.Name, err)
				return cli.ExitUsage
			}
			run, err := d.Setup(log)
			if err != nil {
				fmt.Fprintf(stderr, "%s: %v\n", d.Name, err)
				return cli.ExitUsage
			}
			ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			log.Info(d.Name+" starting", "version", version.String())
			if err := run.run(ctx, log); err != nil {
				log.Error(d.Name+" failed", "err", err)
				return cli.ExitError
			}
			log.Info(d.Name + " stopped")
			return cli.ExitOK
		},
	}.Main(args, stdout, stderr)
}

// NewRegistry is a daemon's metrics registry, holding the Go runtime's and
// the process's collectors.
func NewRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}
