package e2e

import (
	"archive/tar"
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/podnet/podnet/e2e/image"
)

// envImage names the docker-archive make image wrote; make test sets it.
const envImage = "PODNET_IMAGE"

// imageTag is the name podnet's image carries in the tests: not "latest", so
// kubelets use the imported image instead of trying to pull it.
const imageTag = "ghcr.io/podnet/podnet:e2e"

var (
	imageOnce sync.Once
	imagePath string
	imageErr  error
)

// podnetImage returns podnet's image as a docker-archive tagged imageTag:
// $PODNET_IMAGE if set, else built once per test binary from the Dockerfile
// and $PODNET_BIN, as make image builds it.
func podnetImage(t *testing.T) string {
	t.Helper()
	if p := os.Getenv(envImage); p != "" {
		return p
	}
	bin := os.Getenv("PODNET_BIN")
	if bin == "" {
		t.Fatalf("$%s and $PODNET_BIN are unset: run with make test (make image builds the image)", envImage)
	}
	imageOnce.Do(func() {
		spec, err := dockerfileSpec()
		if err != nil {
			imageErr = err
			return
		}
		// COPY sources are bin/NAME relative to the repository root.
		dir, err := os.MkdirTemp("", "podnet-image-")
		if err != nil {
			imageErr = err
			return
		}
		imagePath = filepath.Join(dir, "podnet-image.tar")
		imageErr = image.Build(context.Background(), image.BuildOptions{
			Spec: spec, Root: filepath.Dir(bin), Tag: imageTag, Out: imagePath, CacheDir: "/var/cache/podnet",
		})
		cleanups = append(cleanups, func() { os.RemoveAll(dir) })
	})
	if imageErr != nil {
		t.Fatalf("build podnet's image: %v", imageErr)
	}
	return imagePath
}

// dockerfileSpec is the image ../Dockerfile describes, as make image reads it.
func dockerfileSpec() (image.Spec, error) {
	text, err := os.ReadFile("../Dockerfile")
	if err != nil {
		return image.Spec{}, err
	}
	return image.ParseDockerfile(string(text))
}

// cleanups run after every test of the binary (TestMain).
var cleanups []func()

// TestImage reads the image make image built and checks it is the image the
// Dockerfile describes: every package its final stage installs is installed
// (dpkg's status), every binary it copies is at its destination and is the
// one make build made, iptables resolves to a real binary, and the config has
// the Dockerfile's USER and ENTRYPOINT.
func TestImage(t *testing.T) {
	path := podnetImage(t)
	spec, err := dockerfileSpec()
	if err != nil {
		t.Fatal(err)
	}
	img, err := tarball.Image(func() (io.ReadCloser, error) { return os.Open(path) }, nil)
	if err != nil {
		t.Fatal(err)
	}
	m, err := tarball.LoadManifest(func() (io.ReadCloser, error) { return os.Open(path) })
	if err != nil || len(m) != 1 {
		t.Fatalf("manifest %v, %v", m, err)
	}
	if _, err := name.NewTag(m[0].RepoTags[0]); err != nil || !strings.HasPrefix(m[0].RepoTags[0], "ghcr.io/podnet/podnet:") {
		t.Errorf("image tagged %v", m[0].RepoTags)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cf.Config.User != spec.User || !slices.Equal(cf.Config.Entrypoint, spec.Entrypoint) || !slices.Equal(cf.Config.Cmd, spec.Cmd) {
		t.Errorf("config user %q entrypoint %v; the Dockerfile says %q %v", cf.Config.User, cf.Config.Entrypoint, spec.User, spec.Entrypoint)
	}

	files := map[string][]byte{}
	links := map[string]string{}
	tr := tar.NewReader(mutate.Extract(img))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		n := "/" + strings.TrimPrefix(strings.TrimPrefix(h.Name, "./"), "/")
		switch h.Typeflag {
		case tar.TypeSymlink:
			links[n] = h.Linkname
		case tar.TypeReg:
			if n == "/var/lib/dpkg/status" || strings.HasPrefix(n, "/usr/local/bin/") {
				files[n], _ = io.ReadAll(tr)
			} else {
				files[n] = nil
			}
		}
	}
	status := string(files["/var/lib/dpkg/status"])
	for _, p := range spec.Packages {
		if !regexp.MustCompile(`(?m)^Package: ` + regexp.QuoteMeta(p) + `\nStatus: install ok installed$`).MatchString(status) {
			t.Errorf("package %s is not installed in the image", p)
		}
	}
	bin := os.Getenv("PODNET_BIN")
	for _, f := range spec.Files {
		got, ok := files[f.Dst]
		if !ok {
			t.Errorf("%s is not in the image", f.Dst)
			continue
		}
		if bin != "" {
			want, err := os.ReadFile(filepath.Join(filepath.Dir(bin), f.Src))
			if err == nil && !bytes.Equal(got, want) {
				t.Errorf("%s in the image is not %s", f.Dst, f.Src)
			}
		}
	}
	for _, tool := range []string{"/usr/sbin/iptables", "/usr/sbin/iptables-restore", "/usr/sbin/modprobe", "/usr/sbin/ip"} {
		p := resolveIn(links, tool)
		if _, ok := files[p]; !ok {
			t.Errorf("%s does not resolve to a file in the image (ends at %s)", tool, p)
		}
	}
}

// resolveIn follows the symbolic links of an image (links: path → target)
// in every component of p, as the kernel would (Debian's /bin is one).
func resolveIn(links map[string]string, p string) string {
	for range 16 {
		changed := false
		parts := strings.Split(strings.TrimPrefix(p, "/"), "/")
		for i := range parts {
			prefix := "/" + strings.Join(parts[:i+1], "/")
			l, ok := links[prefix]
			if !ok {
				continue
			}
			if !strings.HasPrefix(l, "/") {
				l = filepath.Join(filepath.Dir(prefix), l)
			}
			p = filepath.Join(append([]string{l}, parts[i+1:]...)...)
			changed = true
			break
		}
		if !changed {
			return p
		}
	}
	return p
}
