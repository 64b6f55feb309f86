package image

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// BuildOptions say what Build writes where.
type BuildOptions struct {
	Spec Spec
	// Root is the directory relative Spec.Files sources are read from.
	Root string
	// Tag names the image inside the archive (RepoTags), as
	// `ctr images import` and kubelets will know it.
	Tag string
	// Out is the docker-archive tarball to write.
	Out string
	// CacheDir keeps the Debian layer between builds, keyed by suite and
	// packages (mmdebstrap takes a minute; the layer changes only with them).
	CacheDir string
	// BaseLayer, when set, is used as the Debian layer instead of running
	// mmdebstrap (tests).
	BaseLayer string
}

// debianDefaultPath is the PATH of Debian's own images.
const debianDefaultPath = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// Build writes the image of o.Spec as a docker-archive tarball: the Debian
// layer (when the spec has a suite), then one layer with the files.
func Build(ctx context.Context, o BuildOptions) error {
	tag, err := name.NewTag(o.Tag)
	if err != nil {
		return fmt.Errorf("image tag %q: %w", o.Tag, err)
	}
	var layers []v1.Layer
	if o.Spec.Suite != "" {
		base := o.BaseLayer
		if base == "" {
			if base, err = DebianLayer(ctx, o.CacheDir, o.Spec.Suite, o.Spec.Packages); err != nil {
				return err
			}
		}
		l, err := tarball.LayerFromFile(base, tarball.WithCompressionLevel(gzip.BestSpeed))
		if err != nil {
			return fmt.Errorf("debian layer %s: %w", base, err)
		}
		layers = append(layers, l)
	}
	files, err := filesLayer(o.Root, o.Spec.Files, o.Spec.Links)
	if err != nil {
		return err
	}
	layers = append(layers, files)
	img, err := mutate.AppendLayers(empty.Image, layers...)
	if err != nil {
		return fmt.Errorf("assemble image: %w", err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return err
	}
	cf = cf.DeepCopy()
	cf.Architecture, cf.OS = "amd64", "linux"
	cf.Config.Entrypoint = o.Spec.Entrypoint
	cf.Config.Cmd = o.Spec.Cmd
	cf.Config.User = o.Spec.User
	cf.Config.WorkingDir = "/"
	cf.Config.Env = append([]string{debianDefaultPath}, o.Spec.Env...)
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		return fmt.Errorf("image config: %w", err)
	}
	tmp := o.Out + ".tmp"
	defer os.Remove(tmp)
	if err := tarball.WriteToFile(tmp, tag, img); err != nil {
		return fmt.Errorf("write %s: %w", o.Out, err)
	}
	return os.Rename(tmp, o.Out)
}

// filesLayer is one uncompressed tar of the files, with their parent
// directories, owned by root, timestamps zero: the same files give the same
// layer digest.
func filesLayer(root string, files []File, links []Link) (v1.Layer, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	dirs := map[string]bool{}
	var names []string
	dsts := make([]string, 0, len(files)+len(links))
	for _, f := range files {
		dsts = append(dsts, f.Dst)
	}
	for _, l := range links {
		dsts = append(dsts, l.Dst)
	}
	for _, dst := range dsts {
		for d := path.Dir(dst); d != "/" && !dirs[d]; d = path.Dir(d) {
			dirs[d] = true
		}
	}
	for d := range dirs {
		names = append(names, d)
	}
	slices.Sort(names)
	for _, d := range names {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: strings.TrimPrefix(d, "/") + "/", Mode: 0o755, Format: tar.FormatPAX}); err != nil {
			return nil, err
		}
	}
	for _, f := range files {
		src := f.Src
		if !filepath.IsAbs(src) {
			src = filepath.Join(root, src)
		}
		data, err := os.ReadFile(src)
		if err != nil {
			return nil, fmt.Errorf("image file %s: %w", f.Dst, err)
		}
		mode := f.Mode
		if mode == 0 {
			mode = 0o644
		}
		hdr := &tar.Header{Typeflag: tar.TypeReg, Name: strings.TrimPrefix(f.Dst, "/"), Mode: mode, Size: int64(len(data)), Format: tar.FormatPAX}
		if err := tw.WriteHeader(hdr); err != nil {
			return nil, err
		}
		if _, err := tw.Write(data); err != nil {
			return nil, err
		}
	}
	for _, l := range links {
		if !path.IsAbs(l.Dst) || l.Target == "" {
			return nil, fmt.Errorf("image link %q -> %q: want an absolute path and a target", l.Dst, l.Target)
		}
		hdr := &tar.Header{Typeflag: tar.TypeSymlink, Name: strings.TrimPrefix(l.Dst, "/"), Linkname: l.Target, Mode: 0o777, Format: tar.FormatPAX}
		if err := tw.WriteHeader(hdr); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	data := buf.Bytes()
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(data)), nil
	}, tarball.WithCompressionLevel(gzip.BestSpeed))
}

// DebianLayer returns a tarball of a Debian root file system of suite with
// packages installed, built by mmdebstrap (which leaves out recommends;
// without documentation and locales, as debian:*-slim) and cached in
// cacheDir.
func DebianLayer(ctx context.Context, cacheDir, suite string, packages []string) (string, error) {
	args := []string{
		"--quiet", "--mode=unshare", "--variant=minbase",
		"--dpkgopt=path-exclude=/usr/share/man/*",
		"--dpkgopt=path-exclude=/usr/share/doc/*",
		"--dpkgopt=path-include=/usr/share/doc/*/copyright",
		"--dpkgopt=path-exclude=/usr/share/locale/*",
	}
	if len(packages) > 0 {
		args = append(args, "--include="+strings.Join(packages, ","))
	}
	sum := sha256.Sum256([]byte(strings.Join(append([]string{suite}, args...), "\n")))
	out := filepath.Join(cacheDir, "debian-"+suite+"-"+hex.EncodeToString(sum[:6])+".tar")
	if _, err := os.Stat(out); err == nil {
		return out, nil
	}
	if err := os.MkdirAll(cacheDir, 0o755); err != nil {
		return "", err
	}
	// Per process: two builds of the same layer at once each write their own
	// and the second rename wins with identical content.
	tmp := fmt.Sprintf("%s.%d.tmp.tar", out, os.Getpid())
	defer os.Remove(tmp)
	cmd := exec.CommandContext(ctx, "mmdebstrap", append(args, suite, tmp)...)
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("mmdebstrap %s with %v: %w\n%s", suite, packages, err, b)
	}
	return out, os.Rename(tmp, out)
}
