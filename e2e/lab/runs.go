package lab

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/podnet/podnet/dataplane/atomicfile"
)

// RunDir holds one record per lab run (<prefix>.json). A run writes its
// record before it creates anything and removes it after it removed
// everything, so a record whose process is gone marks a crashed run.
const RunDir = "/run/podnet-lab"

// familyRun matches the default prefixes. Since a run writes its record
// before it creates anything, objects of this family without a record were
// left by a run whose record is lost too (removed by hand, say); they are
// stale as well.
var familyRun = regexp.MustCompile(`^` + FamilyPrefix + `[0-9a-f]{4}$`)

type runRecord struct {
	Prefix string `json:"prefix"`
	PID    int    `json:"pid"`
	// PIDStart is the start time of PID (field 22 of /proc/PID/stat), so a
	// recycled pid is not mistaken for a live run.
	PIDStart    uint64    `json:"pidStart"`
	WorkDir     string    `json:"workDir"`
	OwnsWorkDir bool      `json:"ownsWorkDir"`
	Kept        bool      `json:"kept,omitempty"`
	Namespaces  []string  `json:"namespaces,omitempty"`
	Created     time.Time `json:"created"`
}

func recordPath(prefix string) string { return filepath.Join(RunDir, prefix+".json") }

// writeRecord stores r for this process.
func writeRecord(r runRecord) error {
	r.PID = os.Getpid()
	start, err := pidStart(r.PID)
	if err != nil {
		return err
	}
	r.PIDStart = start
	r.Created = time.Now().UTC()
	data, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return fmt.Errorf("encode run record: %w", err)
	}
	return atomicfile.WriteFile(recordPath(r.Prefix), append(data, '\n'), 0o644)
}

func removeRecord(prefix string) error {
	if err := os.Remove(recordPath(prefix)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove run record: %w", err)
	}
	return nil
}

func readRecords() ([]runRecord, error) {
	paths, err := filepath.Glob(filepath.Join(RunDir, "*.json"))
	if err != nil {
		return nil, err
	}
	var recs []runRecord
	for _, p := range paths {
		data, err := os.ReadFile(p)
		if errors.Is(err, os.ErrNotExist) {
			continue // removed by its run meanwhile
		}
		if err != nil {
			return nil, fmt.Errorf("read run record: %w", err)
		}
		var r runRecord
		if err := json.Unmarshal(data, &r); err != nil || validName("prefix", r.Prefix) != nil {
			// A torn or foreign file: name the run after the file so it is
			// still cleaned up.
			r = runRecord{Prefix: strings.TrimSuffix(filepath.Base(p), ".json")}
		}
		recs = append(recs, r)
	}
	return recs, nil
}

// pidStart returns the start time of pid in clock ticks since boot.
func pidStart(pid int) (uint64, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name (field 2) may contain spaces; fields are counted
	// after its closing parenthesis, where field 3 is the state.
	s := string(data)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, fmt.Errorf("parse /proc/%d/stat", pid)
	}
	fields := strings.Fields(s[i+1:])
	if len(fields) < 20 {
		return 0, fmt.Errorf("parse /proc/%d/stat", pid)
	}
	return strconv.ParseUint(fields[19], 10, 64)
}

// alive reports whether the process that wrote r still runs.
func (r runRecord) alive() bool {
	if r.PID <= 0 {
		return false
	}
	start, err := pidStart(r.PID)
	return err == nil && start == r.PIDStart
}

// runObjects lists the namespaces and cgroups of every run, by prefix.
type runObjects struct {
	netns   map[string][]string
	cgroups map[string][]string
	// cgroupsV1 are real nodes' kubelet cgroup roots on a hybrid host.
	cgroupsV1 map[string][]string
}

func listRunObjects() (runObjects, error) {
	objs := runObjects{netns: map[string][]string{}, cgroups: map[string][]string{}, cgroupsV1: map[string][]string{}}
	names, err := listNetns()
	if err != nil {
		return objs, err
	}
	// A run's /etc/netns files may outlive its namespaces when it crashed
	// between removing the two; deleteNetns removes both.
	etc, _ := os.ReadDir(etcNetnsDir)
	for _, e := range etc {
		if !slices.Contains(names, e.Name()) {
			names = append(names, e.Name())
		}
	}
	for _, n := range names {
		if prefix, _, ok := strings.Cut(n, "-"); ok {
			objs.netns[prefix] = append(objs.netns[prefix], n)
		}
	}
	root, err := cgroup2Root()
	if err != nil {
		return objs, err
	}
	entries, err := os.ReadDir(root)
	if err != nil {
		return objs, fmt.Errorf("list cgroups: %w", err)
	}
	for _, e := range entries {
		rest, ok := strings.CutPrefix(e.Name(), "podnet-")
		if !e.IsDir() || !ok {
			continue
		}
		if prefix, _, ok := strings.Cut(rest, "-"); ok {
			objs.cgroups[prefix] = append(objs.cgroups[prefix], filepath.Join(root, e.Name()))
		}
	}
	for _, v1 := range CgroupV1Roots() {
		entries, _ := os.ReadDir(v1)
		for _, e := range entries {
			rest, ok := strings.CutPrefix(e.Name(), "podnet-")
			if !e.IsDir() || !ok {
				continue
			}
			if prefix, _, ok := strings.Cut(rest, "-"); ok {
				objs.cgroupsV1[prefix] = append(objs.cgroupsV1[prefix], filepath.Join(v1, e.Name()))
			}
		}
	}
	return objs, nil
}

// removeRun removes every object of the run with the given prefix.
func removeRun(objs runObjects, r runRecord) error {
	var errs []error
	// Processes first: they may hold namespaces open.
	for _, cg := range objs.cgroups[r.Prefix] {
		if err := removeCgroup(cg); err != nil {
			errs = append(errs, err)
		}
	}
	// Emptied by the kill above.
	for _, cg := range objs.cgroupsV1[r.Prefix] {
		if err := RemoveCgroupTree(cg); err != nil {
			errs = append(errs, err)
		}
	}
	for _, n := range objs.netns[r.Prefix] {
		if err := deleteNetns(n); err != nil {
			errs = append(errs, err)
		}
	}
	if r.WorkDir != "" {
		if err := unmountUnder(r.WorkDir); err != nil {
			errs = append(errs, err)
		}
	}
	if r.OwnsWorkDir && r.WorkDir != "" && strings.Contains(filepath.Base(r.WorkDir), "podnet-lab-"+r.Prefix) {
		if err := os.RemoveAll(r.WorkDir); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) == 0 {
		errs = append(errs, removeRecord(r.Prefix))
	}
	return errors.Join(errs...)
}

// sweepStale removes what crashed runs left behind: runs whose record names
// a dead process (and which were not kept on purpose), and namespaces or
// cgroups of the default family with no record at all.
func sweepStale(logf func(string, ...any)) error {
	// Objects first, then records: a live run writes its record before it
	// creates anything, so every object listed here either has its record
	// visible below or belongs to a dead run.
	objs, err := listRunObjects()
	if err != nil {
		return err
	}
	recs, err := readRecords()
	if err != nil {
		return err
	}
	var errs []error
	recorded := map[string]bool{}
	for _, r := range recs {
		recorded[r.Prefix] = true
		if r.Kept || r.alive() {
			continue
		}
		logf("lab: removing stale lab %s (pid %d is gone)", r.Prefix, r.PID)
		errs = append(errs, removeRun(objs, r))
	}
	var orphans []string
	for prefix := range objs.netns {
		orphans = append(orphans, prefix)
	}
	for prefix := range objs.cgroups {
		orphans = append(orphans, prefix)
	}
	for prefix := range objs.cgroupsV1 {
		orphans = append(orphans, prefix)
	}
	slices.Sort(orphans)
	for _, prefix := range slices.Compact(orphans) {
		if recorded[prefix] || !familyRun.MatchString(prefix) {
			continue
		}
		logf("lab: removing stale lab %s (no run record)", prefix)
		errs = append(errs, removeRun(objs, runRecord{Prefix: prefix}))
	}
	return errors.Join(errs...)
}

// KeptLab describes a lab left up with Keep.
type KeptLab struct {
	Prefix     string
	Namespaces []string
	Created    time.Time
}

// Kept lists the labs left up with Keep.
func Kept() ([]KeptLab, error) {
	recs, err := readRecords()
	if err != nil {
		return nil, err
	}
	var kept []KeptLab
	for _, r := range recs {
		if r.Kept {
			kept = append(kept, KeptLab{Prefix: r.Prefix, Namespaces: r.Namespaces, Created: r.Created})
		}
	}
	return kept, nil
}

// Down removes the kept labs with the given prefixes, or every kept lab if
// none are given, and every stale one. It returns the prefixes of the kept
// labs it removed.
func Down(logf func(string, ...any), prefixes ...string) ([]string, error) {
	if logf == nil {
		logf = func(string, ...any) {}
	}
	objs, err := listRunObjects()
	if err != nil {
		return nil, err
	}
	recs, err := readRecords()
	if err != nil {
		return nil, err
	}
	var removed []string
	var errs []error
	for _, r := range recs {
		if !r.Kept || len(prefixes) > 0 && !slices.Contains(prefixes, r.Prefix) {
			continue
		}
		if err := removeRun(objs, r); err != nil {
			errs = append(errs, fmt.Errorf("remove lab %s: %w", r.Prefix, err))
			continue
		}
		removed = append(removed, r.Prefix)
	}
	errs = append(errs, sweepStale(logf))
	return removed, errors.Join(errs...)
}
