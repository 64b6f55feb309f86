// Package logging builds the daemons' *slog.Logger from the flags users
// type for Kubernetes components: -v N (klog's verbosity) and --log-format
// text|json, and routes client-go's klog through it, so a daemon writes one
// stream in one format.
//
// Verbosity maps onto slog levels the way klog's slog bridge does: klog's
// V(n) messages arrive at slog.Level(-n), so -v 4 shows V(4) and below,
// and slog's Debug (-4) with them.
package logging

import (
	"flag"
	"fmt"
	"io"
	"log/slog"
	"strconv"

	"github.com/spf13/pflag"
	"k8s.io/klog/v2"
)

// Options are the logging flags.
type Options struct {
	// Verbosity is -v: 0 logs Info and above; N also klog's V(N) and
	// below (4 and up include Debug).
	Verbosity int
	// Format is "text" or "json".
	Format string
	// Level is the older --log-level (debug, info, warn, error); the more
	// verbose of it and Verbosity wins.
	Level string
}

// AddFlags registers -v, --log-format and --log-level on fs.
func (o *Options) AddFlags(fs *pflag.FlagSet) {
	fs.IntVarP(&o.Verbosity, "v", "v", 0, "log verbosity: 0 logs info and above, N also client-go's V(N) messages (4 and up: debug)")
	fs.StringVar(&o.Format, "log-format", "text", "log format: text or json")
	fs.StringVar(&o.Level, "log-level", "info", "lowest level logged: debug, info, warn or error (-v can lower it)")
}

// Validate names the flag that is wrong.
func (o Options) Validate() error {
	_, err := o.level()
	if err != nil {
		return err
	}
	switch o.Format {
	case "text", "json", "":
	default:
		return fmt.Errorf("--log-format: %q is not text or json", o.Format)
	}
	if o.Verbosity < 0 {
		return fmt.Errorf("-v: %d is negative", o.Verbosity)
	}
	return nil
}

func (o Options) level() (slog.Level, error) {
	var l slog.Level
	if o.Level != "" {
		if err := l.UnmarshalText([]byte(o.Level)); err != nil {
			return 0, fmt.Errorf("--log-level: %w", err)
		}
	}
	return min(l, slog.Level(-o.Verbosity)), nil
}

// New returns the logger writing to w, and sends klog's output (client-go)
// through it with klog's verbosity set to o.Verbosity.
func (o Options) New(w io.Writer) (*slog.Logger, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	level, _ := o.level()
	ho := &slog.HandlerOptions{Level: level}
	var h slog.Handler = slog.NewTextHandler(w, ho)
	if o.Format == "json" {
		h = slog.NewJSONHandler(w, ho)
	}
	logger := slog.New(h)
	var kfs flag.FlagSet
	klog.InitFlags(&kfs)
	if err := kfs.Set("v", strconv.Itoa(o.Verbosity)); err != nil {
		return nil, fmt.Errorf("klog verbosity: %w", err)
	}
	klog.SetSlogLogger(logger.With("component", "client-go"))
	return logger, nil
}
