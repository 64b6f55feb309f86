package image

import (
	"archive/tar"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// TestDockerfileSpec reads podnet's own Dockerfile the way make image does
// and checks it against what the node needs from the image: the four
// binaries in /usr/local/bin, the tools proxyd execs from Debian packages,
// a non-root user.
func TestDockerfileSpec(t *testing.T) {
	text, err := os.ReadFile("../../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	spec, err := ParseDockerfile(string(text))
	if err != nil {
		t.Fatal(err)
	}
	if spec.Suite != "bookworm" {
		t.Errorf("suite %q, want bookworm", spec.Suite)
	}
	for _, p := range []string{"iptables", "kmod", "iproute2"} {
		if !slices.Contains(spec.Packages, p) {
			t.Errorf("packages %v lack %s", spec.Packages, p)
		}
	}
	for _, b := range []string{"podnet", "loopback", "portmap", "proxyd", "dnsd"} {
		want := File{Src: "bin/" + b, Dst: "/usr/local/bin/" + b, Mode: 0o755}
		if !slices.Contains(spec.Files, want) {
			t.Errorf("files %v lack %v", spec.Files, want)
		}
	}
	if spec.User == "" || strings.HasPrefix(spec.User, "0") || strings.HasPrefix(spec.User, "root") {
		t.Errorf("user %q, want a non-root one", spec.User)
	}
	if len(spec.Entrypoint) == 0 {
		t.Error("no entrypoint")
	}
}

// TestBuildIsTheDockerfilesImage builds the image of a Dockerfile (with a
// stand-in Debian layer) and reads the archive back: the config carries the
// Dockerfile's USER and ENTRYPOINT, the last layer holds each COPY at its
// destination, byte for byte, and the tag is the one asked for.
func TestBuildIsTheDockerfilesImage(t *testing.T) {
	dir := t.TempDir()
	for _, b := range []string{"a", "b"} {
		if err := os.MkdirAll(filepath.Join(dir, "bin"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "bin", b), []byte("binary "+b), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	base := filepath.Join(dir, "base.tar")
	writeTar(t, base, map[string]string{"usr/sbin/iptables": "stand-in"})
	dockerfile := `FROM golang:1.26-bookworm AS build
RUN make everything
FROM debian:bookworm-slim
# a comment
RUN apt-get update \
 && apt-get install -y --no-install-recommends iptables kmod \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /src/bin/a /src/bin/b /usr/local/bin/
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/a", "--flag"]
CMD ["serve"]
`
	spec, err := ParseDockerfile(dockerfile)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(spec.Packages, []string{"iptables", "kmod"}) {
		t.Errorf("packages %v", spec.Packages)
	}
	spec.Links = []Link{{Dst: "/usr/local/bin/wget", Target: "/bin/busybox"}}
	out := filepath.Join(dir, "img.tar")
	o := BuildOptions{Spec: spec, Root: dir, Tag: "example.org/x/y:t1", Out: out, BaseLayer: base}
	if err := Build(context.Background(), o); err != nil {
		t.Fatal(err)
	}
	tag, _ := name.NewTag("example.org/x/y:t1")
	img, err := tarball.ImageFromPath(out, &tag)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cf.Config.User != "65532:65532" || !slices.Equal(cf.Config.Entrypoint, []string{"/usr/local/bin/a", "--flag"}) || !slices.Equal(cf.Config.Cmd, []string{"serve"}) {
		t.Errorf("config user %q entrypoint %v cmd %v", cf.Config.User, cf.Config.Entrypoint, cf.Config.Cmd)
	}
	layers, err := img.Layers()
	if err != nil || len(layers) != 2 {
		t.Fatalf("%d layers (%v), want the Debian one and the files", len(layers), err)
	}
	files := readAll(t, mutate.Extract(img))
	for path, want := range map[string]string{"usr/local/bin/a": "binary a", "usr/local/bin/b": "binary b", "usr/sbin/iptables": "stand-in"} {
		if got, ok := files[path]; !ok || got.data != want {
			t.Errorf("%s: %q (present %v), want %q", path, got.data, ok, want)
		}
	}
	if l := files["usr/local/bin/wget"]; l.link != "/bin/busybox" {
		t.Errorf("usr/local/bin/wget links to %q, want /bin/busybox", l.link)
	}
	if m := files["usr/local/bin/a"].mode; m != 0o755 {
		t.Errorf("usr/local/bin/a mode %o, want 755", m)
	}

	// The same inputs give the same image.
	again := filepath.Join(dir, "again.tar")
	o.Out = again
	if err := Build(context.Background(), o); err != nil {
		t.Fatal(err)
	}
	img2, err := tarball.ImageFromPath(again, &tag)
	if err != nil {
		t.Fatal(err)
	}
	d1, _ := img.Digest()
	d2, _ := img2.Digest()
	if d1 != d2 {
		t.Errorf("two builds of the same files: %s and %s", d1, d2)
	}
}

func TestParseDockerfileRefuses(t *testing.T) {
	for _, tc := range []struct{ text, want string }{
		{"FROM alpine:3\n", "debian"},
		{"FROM debian:bookworm\nRUN curl x | sh\n", "line 2"},
		{"FROM debian:bookworm\nCOPY bin/x /usr/\n", "--from=build"},
		{"FROM debian:bookworm\nCOPY --from=build /elsewhere/x /usr/bin/\n", "/src/"},
		{"FROM debian:bookworm\nENTRYPOINT /bin/sh\n", "exec form"},
		{"FROM debian:bookworm\nVOLUME /x\n", "VOLUME"},
	} {
		if _, err := ParseDockerfile(tc.text); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %v, want an error mentioning %q", tc.text, err, tc.want)
		}
	}
}

func writeTar(t *testing.T, path string, files map[string]string) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	tw := tar.NewWriter(f)
	for n, d := range files {
		if err := tw.WriteHeader(&tar.Header{Name: n, Mode: 0o755, Size: int64(len(d)), Typeflag: tar.TypeReg}); err != nil {
			t.Fatal(err)
		}
		tw.Write([]byte(d))
	}
	if err := errors.Join(tw.Close(), f.Close()); err != nil {
		t.Fatal(err)
	}
}

type entry struct {
	data string
	mode int64
	link string // a symbolic link's target
}

func readAll(t *testing.T, r io.ReadCloser) map[string]entry {
	t.Helper()
	defer r.Close()
	out := map[string]entry{}
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(tr)
		out[strings.TrimPrefix(h.Name, "./")] = entry{string(b), h.Mode & 0o7777, h.Linkname}
	}
}
