// Command mkimage builds podnet's image as a docker-archive tarball (for
// `ctr images import` or `docker load`) from the final stage of the
// Dockerfile and the binaries make build left in bin/, without a Docker
// engine: `make image`.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/pflag"

	"github.com/podnet/podnet/e2e/image"
)

func main() {
	var o image.BuildOptions
	dockerfile := pflag.String("dockerfile", "Dockerfile", "the Dockerfile whose final stage describes the image")
	pflag.StringVar(&o.Root, "root", ".", "the directory COPY --from=build sources are relative to (the repository root)")
	pflag.StringVar(&o.Tag, "tag", "ghcr.io/podnet/podnet:dev", "the image's name and tag inside the archive")
	pflag.StringVar(&o.Out, "out", "bin/podnet-image.tar", "the docker-archive tarball to write")
	pflag.StringVar(&o.CacheDir, "cache-dir", "/var/cache/podnet", "where the Debian layer (mmdebstrap) is cached")
	pflag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	text, err := os.ReadFile(*dockerfile)
	if err == nil {
		o.Spec, err = image.ParseDockerfile(string(text))
	}
	if err == nil {
		err = image.Build(ctx, o)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "mkimage:", err)
		os.Exit(1)
	}
	fmt.Printf("%s: %s\n", o.Out, o.Tag)
}
