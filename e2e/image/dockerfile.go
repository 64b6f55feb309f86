// Package image builds container images as docker-archive tarballs without a
// Docker engine or a registry (go-containerregistry writes them, as ko does):
// podnet's own image from the final stage of the Dockerfile, so that the two
// cannot describe different images, and the small static images the real-node
// lab imports into containerd (pause, test servers).
package image

import (
	"encoding/json"
	"fmt"
	"path"
	"regexp"
	"slices"
	"strings"
)

// Spec is an image as make image builds it: an optional Debian root file
// system with Packages installed, then Files on top, run as User.
type Spec struct {
	// Suite is the Debian release of the base ("bookworm"); empty for an
	// image of Files alone.
	Suite    string
	Packages []string
	Files    []File
	// Links are symbolic links the image adds (a busybox applet under
	// its name, as busybox --install would make it).
	Links []Link
	User  string
	// Entrypoint and Cmd (its default arguments) in exec form.
	Entrypoint []string
	Cmd        []string
	Env        []string
}

// File is one file of the image: Src on the build machine (relative to the
// build's root directory unless absolute), Dst its absolute path in the image.
type File struct {
	Src, Dst string
	Mode     int64
}

// Link is a symbolic link at Dst (absolute) pointing to Target.
type Link struct {
	Dst, Target string
}

// buildRoot is the WORKDIR of the Dockerfile's build stage: COPY --from=build
// sources under it are the same paths relative to the repository root.
const buildRoot = "/src/"

var debianBase = regexp.MustCompile(`^(?:docker\.io/)?(?:library/)?debian:([a-z]+)(?:-slim)?$`)

// ParseDockerfile reads the final stage of a Dockerfile into the Spec make
// image builds. It understands the instructions podnet's Dockerfile uses in
// that stage and refuses anything else by name, so a change to the
// Dockerfile that make image cannot follow fails the build instead of
// silently producing a different image.
func ParseDockerfile(text string) (Spec, error) {
	var spec Spec
	final := -1
	insts := instructions(text)
	for i, in := range insts {
		if in.op == "FROM" {
			final = i
		}
	}
	if final < 0 {
		return spec, fmt.Errorf("dockerfile: no FROM")
	}
	for _, in := range insts[final:] {
		var err error
		switch in.op {
		case "FROM":
			f := strings.Fields(in.args)
			m := debianBase.FindStringSubmatch(f[0])
			if m == nil {
				return spec, fmt.Errorf("dockerfile line %d: final stage FROM %s: make image builds only debian:<suite>[-slim] bases", in.line, f[0])
			}
			spec.Suite = m[1]
		case "RUN":
			var pkgs []string
			if pkgs, err = aptInstalls(in.args); err == nil {
				spec.Packages = append(spec.Packages, pkgs...)
			}
		case "COPY":
			var files []File
			if files, err = copies(in.args); err == nil {
				spec.Files = append(spec.Files, files...)
			}
		case "USER":
			spec.User = strings.TrimSpace(in.args)
		case "ENV":
			k, v, ok := strings.Cut(strings.TrimSpace(in.args), "=")
			if !ok || strings.ContainsAny(k, " \t") {
				err = fmt.Errorf("only ENV KEY=VALUE is supported")
			}
			spec.Env = append(spec.Env, k+"="+v)
		case "ENTRYPOINT":
			if err = json.Unmarshal([]byte(in.args), &spec.Entrypoint); err != nil {
				err = fmt.Errorf("ENTRYPOINT must be in exec form (a JSON list): %w", err)
			}
		case "CMD":
			if err = json.Unmarshal([]byte(in.args), &spec.Cmd); err != nil {
				err = fmt.Errorf("CMD must be in exec form (a JSON list): %w", err)
			}
		default:
			err = fmt.Errorf("make image does not support %s in the final stage", in.op)
		}
		if err != nil {
			return spec, fmt.Errorf("dockerfile line %d: %w", in.line, err)
		}
	}
	return spec, nil
}

type instruction struct {
	line int
	op   string
	args string
}

// instructions splits a Dockerfile into instructions: comments dropped,
// backslash continuations joined.
func instructions(text string) []instruction {
	var out []instruction
	var cur *instruction
	for i, l := range strings.Split(text, "\n") {
		t := strings.TrimSpace(l)
		if strings.HasPrefix(t, "#") || (t == "" && cur == nil) {
			continue
		}
		cont := strings.HasSuffix(t, "\\")
		t = strings.TrimSuffix(t, "\\")
		if cur == nil {
			op, args, _ := strings.Cut(t, " ")
			cur = &instruction{line: i + 1, op: strings.ToUpper(op), args: args}
		} else {
			cur.args += " " + t
		}
		if !cont {
			out = append(out, *cur)
			cur = nil
		}
	}
	if cur != nil {
		out = append(out, *cur)
	}
	return out
}

// aptInstalls returns the packages of the apt-get install in a RUN. The
// other commands it accepts are the ones mmdebstrap does anyway (update,
// list cleanup); anything else is refused.
func aptInstalls(run string) ([]string, error) {
	var pkgs []string
	for _, cmd := range strings.Split(run, "&&") {
		f := strings.Fields(cmd)
		switch {
		case len(f) >= 2 && f[0] == "apt-get" && f[1] == "update":
		case len(f) >= 3 && f[0] == "rm" && f[1] == "-rf" && f[2] == "/var/lib/apt/lists/*":
		case len(f) >= 2 && f[0] == "apt-get" && slices.Contains(f, "install"):
			for _, a := range f[2:] {
				if !strings.HasPrefix(a, "-") && a != "install" {
					pkgs = append(pkgs, a)
				}
			}
		default:
			return nil, fmt.Errorf("RUN %q: make image runs only apt-get update/install and the apt list cleanup", strings.TrimSpace(cmd))
		}
	}
	return pkgs, nil
}

// copies reads COPY --from=build SRC... DST, sources under the build stage's
// WORKDIR.
func copies(args string) ([]File, error) {
	f := strings.Fields(args)
	if len(f) < 3 || f[0] != "--from=build" {
		return nil, fmt.Errorf("COPY %s: only COPY --from=build SRC... DST is supported", args)
	}
	srcs, dst := f[1:len(f)-1], f[len(f)-1]
	if len(srcs) > 1 && !strings.HasSuffix(dst, "/") {
		return nil, fmt.Errorf("COPY of several files to %s, which is not a directory (no trailing /)", dst)
	}
	var out []File
	for _, s := range srcs {
		if !strings.HasPrefix(s, buildRoot) {
			return nil, fmt.Errorf("COPY source %s is not under the build stage's %s", s, buildRoot)
		}
		d := dst
		if strings.HasSuffix(dst, "/") {
			d = path.Join(dst, path.Base(s))
		}
		out = append(out, File{Src: strings.TrimPrefix(s, buildRoot), Dst: d, Mode: 0o755})
	}
	return out, nil
}
