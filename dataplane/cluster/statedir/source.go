// Package statedir fills a cluster.Store from a directory of Kubernetes
// objects in the form `kubectl get -o yaml` prints, and keeps it current
// while files change. It is podnet's embedded control plane: no API server
// needed.
//
// Every *.yaml, *.yml and *.json file under the directory (recursively,
// skipping names that start with ".", which is where editors and atomic
// writers keep their temporary files) is parsed on its own and its objects
// remembered per file; the Store gets the union. fsnotify tells which files
// changed; a periodic rescan comparing size and mtime catches anything the
// watcher missed (overflowed queues, directories created between watch
// and walk).
package statedir

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/fsnotify/fsnotify"

	"github.com/podnet/podnet/dataplane/cluster"
	"github.com/podnet/podnet/dataplane/cluster/convert"
)

// Options configures a Source.
type Options struct {
	Dir    string
	Store  *cluster.Store
	Logger *slog.Logger
	// Kinds the source owns in the Store; objects of other kinds in the
	// files are ignored. Default: every kind.
	Kinds []cluster.Kind
	// Debounce is how long to wait after a change for a burst to settle.
	// Default 100 ms.
	Debounce time.Duration
	// Rescan is the period of the safety-net rescan. Default 5 s.
	Rescan time.Duration
	// Limits are the API server settings objects are checked against
	// (--service-cluster-ip-range, --service-node-port-range); the zero
	// value means kube-apiserver's defaults.
	Limits convert.Limits
}

// Source is a state directory feeding a Store.
type Source struct {
	o Options

	mu    sync.Mutex
	files map[string]*fileState // by path
	dups  string                // last duplicate report, to warn only on change
}

type fileState struct {
	size    int64
	modTime time.Time
	objs    []cluster.Object // last successfully parsed
	err     error            // current parse error, if any
	refused []error          // objects of the last parse that were refused
}

// New returns a Source; nothing happens until Run.
func New(o Options) *Source {
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if len(o.Kinds) == 0 {
		o.Kinds = []cluster.Kind{cluster.KindNode, cluster.KindService, cluster.KindEndpointSlice, cluster.KindNamespace, cluster.KindPod}
	}
	if o.Debounce <= 0 {
		o.Debounce = 100 * time.Millisecond
	}
	if o.Rescan <= 0 {
		o.Rescan = 5 * time.Second
	}
	return &Source{o: o, files: make(map[string]*fileState)}
}

// FileErrors returns the current parse error of every file that has one.
func (s *Source) FileErrors() map[string]error {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]error)
	for p, f := range s.files {
		if err := errors.Join(append([]error{f.err}, f.refused...)...); err != nil {
			out[p] = err
		}
	}
	return out
}

// Run loads the directory, fills the Store, marks it synced and then keeps
// it current until ctx ends. A missing directory is an error; an empty one
// is an empty cluster.
func (s *Source) Run(ctx context.Context) error {
	if st, err := os.Stat(s.o.Dir); err != nil {
		return fmt.Errorf("state directory: %w", err)
	} else if !st.IsDir() {
		return fmt.Errorf("state directory %s: not a directory", s.o.Dir)
	}
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("watch state directory: %w", err)
	}
	defer w.Close()

	// Watches go in before the first scan so nothing written in between is
	// missed.
	s.scan(w, nil)
	s.o.Store.MarkSynced()

	ticker := time.NewTicker(s.o.Rescan)
	defer ticker.Stop()
	var (
		dirty    = make(map[string]bool)
		debounce = time.NewTimer(time.Hour)
		pending  bool
	)
	debounce.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-w.Events:
			if !ok {
				return errors.New("state directory watcher closed")
			}
			dirty[ev.Name] = true
			if !pending {
				pending = true
				debounce.Reset(s.o.Debounce)
			}
		case err, ok := <-w.Errors:
			if !ok {
				return errors.New("state directory watcher closed")
			}
			// An overflow loses events; rescan everything from scratch.
			s.o.Logger.Warn("state directory watch error; rescanning", "dir", s.o.Dir, "err", err)
			s.scan(w, nil)
		case <-debounce.C:
			pending = false
			s.scan(w, dirty)
			dirty = make(map[string]bool)
		case <-ticker.C:
			s.scan(w, nil)
		}
	}
}

func wanted(name string) bool {
	switch filepath.Ext(name) {
	case ".yaml", ".yml", ".json":
		return !strings.HasPrefix(filepath.Base(name), ".")
	}
	return false
}

// scan walks the directory, re-parses files that are new, changed (size or
// mtime) or named in dirty, drops files that are gone, and replaces the
// Store's contents if anything changed.
func (s *Source) scan(w *fsnotify.Watcher, dirty map[string]bool) {
	seen := make(map[string]bool)
	changed := false
	err := filepath.WalkDir(s.o.Dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			if path == s.o.Dir {
				return err
			}
			return nil // vanished while walking; the next scan settles it
		}
		if d.IsDir() {
			if path != s.o.Dir && strings.HasPrefix(d.Name(), ".") {
				return filepath.SkipDir
			}
			// Adding a watch twice is harmless.
			if err := w.Add(path); err != nil {
				s.o.Logger.Warn("cannot watch directory", "path", path, "err", err)
			}
			return nil
		}
		if !wanted(path) {
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return nil
		}
		seen[path] = true
		s.mu.Lock()
		f := s.files[path]
		s.mu.Unlock()
		if f != nil && !dirty[path] && f.size == info.Size() && f.modTime.Equal(info.ModTime()) {
			return nil
		}
		if s.load(path, info, f) {
			changed = true
		}
		return nil
	})
	if err != nil {
		s.o.Logger.Error("cannot read state directory", "dir", s.o.Dir, "err", err)
		return
	}
	s.mu.Lock()
	for path := range s.files {
		if !seen[path] {
			delete(s.files, path)
			changed = true
			s.o.Logger.Info("state file removed", "path", path)
		}
	}
	var objs []cluster.Object
	if changed {
		objs = s.unionLocked()
	}
	s.mu.Unlock()
	if changed {
		s.o.Store.Replace(s.o.Kinds, objs)
	}
}

// load parses one file and records the result. It reports whether the
// file's objects changed.
func (s *Source) load(path string, info fs.FileInfo, prev *fileState) bool {
	data, err := os.ReadFile(path)
	if err != nil {
		return false // vanished or unreadable; the next scan decides
	}
	parsed, perr := ParseFile(path, data, s.o.Limits)
	s.mu.Lock()
	defer s.mu.Unlock()
	f := &fileState{size: info.Size(), modTime: info.ModTime()}
	if perr != nil {
		// A half-written or broken edit never takes down what was working:
		// the file keeps the objects of its last good parse until fixed.
		if prev != nil {
			f.objs = prev.objs
		}
		f.err, f.refused = perr, prev.refusedOrNil()
		if prev == nil || prev.err == nil || prev.err.Error() != perr.Error() {
			s.o.Logger.Error("state file does not parse; keeping its last good objects", "path", path, "err", perr)
		}
		s.files[path] = f
		return false
	}
	for _, ig := range parsed.Ignored {
		s.o.Logger.Debug("ignoring object of unused kind", "path", path, "line", ig.Line, "apiVersion", ig.APIVersion, "kind", ig.Kind, "name", ig.Name)
	}
	if prev != nil && prev.err != nil {
		s.o.Logger.Info("state file parses again", "path", path)
	}
	f.objs = s.keepRefused(path, parsed, prev)
	f.refused = make([]error, len(parsed.Refused))
	for i, r := range parsed.Refused {
		f.refused[i] = r.Err
	}
	s.files[path] = f
	return true
}

func (f *fileState) refusedOrNil() []error {
	if f == nil {
		return nil
	}
	return f.refused
}

// keepRefused returns the file's objects with, for each refused one, the
// version the file last held of it, as the API server keeps the stored
// object when it refuses an update. A refusal is logged once.
func (s *Source) keepRefused(path string, parsed Parsed, prev *fileState) []cluster.Object {
	objs := parsed.Objects
	for _, r := range parsed.Refused {
		var kept cluster.Object
		if prev != nil {
			for _, o := range prev.objs {
				if o.Kind() == r.Kind && o.Key() == r.Key {
					kept = o
				}
			}
		}
		if kept != nil {
			objs = append(objs, kept)
		}
		if prev == nil || !slices.ContainsFunc(prev.refused, func(e error) bool { return e.Error() == r.Err.Error() }) {
			s.o.Logger.Error("state file object refused; the rest of the file is used", "path", path, "line", r.Err.Line, "err", r.Err.Err, "keptPrevious", kept != nil)
		}
	}
	return objs
}

type objID struct {
	kind cluster.Kind
	key  cluster.Key
}

// unionLocked merges every file's objects; for duplicates the last file in
// sorted path order wins.
func (s *Source) unionLocked() []cluster.Object {
	paths := slices.Sorted(maps.Keys(s.files))
	byID := make(map[objID]cluster.Object)
	from := make(map[objID]string)
	var order []objID
	var dups []string
	for _, p := range paths {
		for _, o := range s.files[p].objs {
			id := objID{o.Kind(), o.Key()}
			if prev, ok := from[id]; ok {
				if prev != p {
					dups = append(dups, fmt.Sprintf("%s %s in %s and %s", id.kind, id.key, prev, p))
				}
			} else {
				order = append(order, id)
			}
			byID[id] = o
			from[id] = p
		}
	}
	if d := strings.Join(dups, "; "); d != s.dups {
		s.dups = d
		if d != "" {
			s.o.Logger.Warn("duplicate objects in state directory; the last file in sorted order wins", "duplicates", d)
		}
	}
	out := make([]cluster.Object, 0, len(order))
	for _, id := range order {
		out = append(out, byID[id])
	}
	return out
}
