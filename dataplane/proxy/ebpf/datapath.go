package ebpf

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/podnet/podnet/bpf"
)

// DefaultPinDir is where proxyd pins maps and links.
const DefaultPinDir = "/sys/fs/bpf/podnet"

// linksDir holds one pinned link per program, under the pin dir.
const linksDir = "links"

// Datapath is the socket-LB programs, attached to a cgroup through pinned
// links, and their pinned maps. Closing it leaves everything attached: a
// new proxyd picks it up where this one left off.
type Datapath struct {
	Maps   *Maps
	coll   *ebpf.Collection // socket LB
	np     *ebpf.Collection // tc programs for traffic from outside
	term   *ebpf.Collection // the UDP socket terminator
	pinDir string
	links  []link.Link
}

// attachTypes says where each program of bpf/sock.c attaches.
var attachTypes = map[string]ebpf.AttachType{
	bpf.SockProgSock4Connect:     ebpf.AttachCGroupInet4Connect,
	bpf.SockProgSock4Sendmsg:     ebpf.AttachCGroupUDP4Sendmsg,
	bpf.SockProgSock4Recvmsg:     ebpf.AttachCGroupUDP4Recvmsg,
	bpf.SockProgSock4Getpeername: ebpf.AttachCgroupInet4GetPeername,
	bpf.SockProgSock6Connect:     ebpf.AttachCGroupInet6Connect,
	bpf.SockProgSock6Sendmsg:     ebpf.AttachCGroupUDP6Sendmsg,
	bpf.SockProgSock6Recvmsg:     ebpf.AttachCGroupUDP6Recvmsg,
	bpf.SockProgSock6Getpeername: ebpf.AttachCgroupInet6GetPeername,
}

// Open loads the programs, reusing the maps pinned in pinDir (creating
// and pinning them on first use), and attaches them to cgroup: links
// already pinned there are updated in place to the new programs, so
// sockets never see a moment without them. pinDir is mounted as a bpffs
// when it is not on one.
func Open(pinDir, cgroup string) (*Datapath, error) {
	d, err := Load(pinDir, cgroup)
	if err != nil {
		return nil, err
	}
	if err := d.Attach(cgroup); err != nil {
		d.Close()
		return nil, err
	}
	return d, nil
}

// Load is Open without attaching: the programs are loaded and the maps
// pinned (reused, or new ones of a new layout), so they can be filled
// before the programs reading them serve a socket (Attach).
func Load(pinDir, cgroup string) (*Datapath, error) {
	if err := checkCgroup(cgroup); err != nil {
		return nil, err
	}
	if err := ensureBPFFS(pinDir); err != nil {
		return nil, err
	}
	return load(pinDir)
}

// Attach attaches the loaded programs to cgroup (see Open), then unpins
// what the programs attached before them used and these do not: maps of
// an older layout, whose entries these programs never read.
func (d *Datapath) Attach(cgroup string) error {
	if err := d.attach(d.pinDir, cgroup); err != nil {
		return err
	}
	return removeStale(d.pinDir)
}

// specs are the objects' specs, their maps pinned by name: the maps both
// declare (services, backends, node addresses) are one.
func specs() (sock, np, term *ebpf.CollectionSpec, err error) {
	if sock, err = bpf.LoadSock(); err != nil {
		return nil, nil, nil, err
	}
	if np, err = bpf.LoadNodeport(); err != nil {
		return nil, nil, nil, err
	}
	if term, err = bpf.LoadSockterm(); err != nil {
		return nil, nil, nil, err
	}
	for _, s := range []*ebpf.CollectionSpec{sock, np, term} {
		for _, m := range s.Maps {
			m.Pinning = ebpf.PinByName
		}
	}
	return sock, np, term, nil
}

// load loads both objects with their maps pinned in pinDir ("": not
// pinned, the tc object then shares the socket object's maps by
// replacement).
func load(pinDir string) (*Datapath, error) {
	sockSpec, npSpec, termSpec, err := specs()
	if err != nil {
		return nil, err
	}
	if pinDir == "" {
		for _, s := range []*ebpf.CollectionSpec{sockSpec, npSpec, termSpec} {
			for _, m := range s.Maps {
				m.Pinning = ebpf.PinNone
			}
		}
	}
	coll, err := loadPinned(sockSpec, pinDir, nil)
	if err != nil {
		return nil, err
	}
	shared := func(spec *ebpf.CollectionSpec) map[string]*ebpf.Map {
		if pinDir != "" {
			return nil
		}
		out := map[string]*ebpf.Map{}
		for name := range spec.Maps {
			if m := coll.Maps[name]; m != nil {
				out[name] = m
			}
		}
		return out
	}
	np, err := loadPinned(npSpec, pinDir, shared(npSpec))
	if err != nil {
		coll.Close()
		return nil, err
	}
	term, err := loadPinned(termSpec, pinDir, shared(termSpec))
	if err != nil {
		coll.Close()
		np.Close()
		return nil, err
	}
	return &Datapath{coll: coll, np: np, term: term, pinDir: pinDir, Maps: &Maps{
		Services:  kernelTable[svcKey, svcVal]{coll.Maps[bpf.SockMapServicesV2]},
		Backends:  kernelTable[uint32, backend]{coll.Maps[bpf.SockMapBackendsV2]},
		NodeAddrs: kernelTable[nodeKey, uint8]{coll.Maps[bpf.SockMapNodeaddrsV1]},
		Ranges:    kernelTable[rangeKey, uint8]{np.Maps[bpf.NodeportMapSrcrangeV2]},
		Maglev:    kernelTable[uint32, maglevTable]{np.Maps[bpf.NodeportMapMaglevV2]},
		SNAT:      kernelTable[uint32, bpf.NodeportSnatAddr]{np.Maps[bpf.NodeportMapSnatV2]},
	}}, nil
}

// loadPinned loads spec with its maps pinned in pinDir. A pinned map whose
// definition no longer matches (a layout change without a new version in
// its name) is replaced.
func loadPinned(spec *ebpf.CollectionSpec, pinDir string, replace map[string]*ebpf.Map) (*ebpf.Collection, error) {
	opts := ebpf.CollectionOptions{Maps: ebpf.MapOptions{PinPath: pinDir}, MapReplacements: replace}
	coll, err := ebpf.NewCollectionWithOptions(spec, opts)
	if errors.Is(err, ebpf.ErrMapIncompatible) {
		for name := range spec.Maps {
			if m, err := ebpf.LoadPinnedMap(filepath.Join(pinDir, name), nil); err == nil {
				if m.Type() != spec.Maps[name].Type || m.KeySize() != spec.Maps[name].KeySize ||
					m.ValueSize() != spec.Maps[name].ValueSize || m.MaxEntries() != spec.Maps[name].MaxEntries {
					_ = m.Unpin()
				}
				m.Close()
			}
		}
		coll, err = ebpf.NewCollectionWithOptions(spec, opts)
	}
	if err != nil {
		var ve *ebpf.VerifierError
		if errors.As(err, &ve) {
			return nil, fmt.Errorf("load BPF programs: %+v", ve)
		}
		return nil, fmt.Errorf("load BPF programs: %w", err)
	}
	return coll, nil
}

func (d *Datapath) attach(pinDir, cgroup string) error {
	dir := filepath.Join(pinDir, linksDir)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("create %s: %w", dir, err)
	}
	cgID, err := cgroupID(cgroup)
	if err != nil {
		return err
	}
	names := make([]string, 0, len(attachTypes))
	for name := range attachTypes {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		prog := d.coll.Programs[name]
		path := filepath.Join(dir, name)
		if l, err := link.LoadPinnedLink(path, nil); err == nil {
			if sameCgroup(l, cgID) {
				if err := l.Update(prog); err != nil {
					l.Close()
					return fmt.Errorf("update link %s: %w", path, err)
				}
				d.links = append(d.links, l)
				continue
			}
			// Attached elsewhere (--bpf-cgroup changed): detach it.
			_ = l.Unpin()
			l.Close()
		}
		l, err := link.AttachCgroup(link.CgroupOptions{Path: cgroup, Attach: attachTypes[name], Program: prog})
		if err != nil {
			return fmt.Errorf("attach %s to cgroup %s: %w", name, cgroup, err)
		}
		if err := l.Pin(path); err != nil {
			l.Close()
			return fmt.Errorf("pin link %s: %w", path, err)
		}
		d.links = append(d.links, l)
	}
	return nil
}

func sameCgroup(l link.Link, id uint64) bool {
	info, err := l.Info()
	if err != nil {
		return false
	}
	cg := info.Cgroup()
	return cg != nil && cg.CgroupId == id
}

// cgroupID is the id the kernel reports for cgroup: its inode number.
func cgroupID(cgroup string) (uint64, error) {
	var st unix.Stat_t
	if err := unix.Stat(cgroup, &st); err != nil {
		return 0, fmt.Errorf("cgroup %s: %w", cgroup, err)
	}
	return st.Ino, nil
}

// versionedName matches podnet's map pins (name_vN); a bpffs mounted on
// the pin dir also holds the kernel's own maps.debug and progs.debug.
var versionedName = regexp.MustCompile(`^[a-z0-9_]+_v[0-9]+$`)

// removeStale unpins what the current objects do not use: maps of an older
// layout, links of programs that are gone. It runs after the new programs
// are attached, so traffic moves to the new maps first.
func removeStale(pinDir string) error {
	sockSpec, npSpec, termSpec, err := specs()
	if err != nil {
		return err
	}
	entries, err := os.ReadDir(pinDir)
	if err != nil {
		return fmt.Errorf("read %s: %w", pinDir, err)
	}
	var errs []error
	for _, e := range entries {
		name := e.Name()
		if name == linksDir || sockSpec.Maps[name] != nil || npSpec.Maps[name] != nil || termSpec.Maps[name] != nil || !versionedName.MatchString(name) {
			continue
		}
		errs = append(errs, os.Remove(filepath.Join(pinDir, e.Name())))
	}
	links, _ := os.ReadDir(filepath.Join(pinDir, linksDir))
	for _, e := range links {
		prog, _, _ := strings.Cut(e.Name(), "@")
		if _, ok := attachTypes[prog]; !ok && npSpec.Programs[prog] == nil {
			errs = append(errs, unpinLink(filepath.Join(pinDir, linksDir, e.Name())))
		}
	}
	return errors.Join(errs...)
}

func unpinLink(path string) error {
	l, err := link.LoadPinnedLink(path, nil)
	if err != nil {
		// Not a link (or a kernel that cannot read it back): the pin
		// still goes.
		if rmErr := os.Remove(path); rmErr != nil && !errors.Is(rmErr, fs.ErrNotExist) {
			return fmt.Errorf("remove %s: %w", path, rmErr)
		}
		return nil
	}
	defer l.Close()
	// Unpinned and closed, the link detaches: the program leaves the
	// cgroup.
	return l.Unpin()
}

// Close releases this process's handles; pins keep programs attached and
// maps filled.
func (d *Datapath) Close() error {
	for _, l := range d.links {
		l.Close()
	}
	d.links = nil
	if d.coll != nil {
		d.coll.Close()
	}
	if d.np != nil {
		d.np.Close()
	}
	if d.term != nil {
		d.term.Close()
	}
	return nil
}

// Cleanup detaches every program podnet attached through pinDir, removes
// every pin and then the directory, unless it is a mount point: a bpffs
// mounted there (by podnet or by whoever prepared the node) stays, empty.
// A missing pinDir is no error.
func Cleanup(pinDir string) error {
	if _, err := os.Stat(pinDir); errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	var errs []error
	links, _ := os.ReadDir(filepath.Join(pinDir, linksDir))
	for _, e := range links {
		errs = append(errs, unpinLink(filepath.Join(pinDir, linksDir, e.Name())))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("clean up %s: %w", pinDir, err)
	}
	if err := os.Remove(filepath.Join(pinDir, linksDir)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("clean up %s: %w", pinDir, err)
	}
	entries, err := os.ReadDir(pinDir)
	if err != nil {
		return fmt.Errorf("clean up %s: %w", pinDir, err)
	}
	for _, e := range entries {
		if versionedName.MatchString(e.Name()) {
			errs = append(errs, os.Remove(filepath.Join(pinDir, e.Name())))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("clean up %s: %w", pinDir, err)
	}
	if isMountPoint(pinDir) {
		return nil
	}
	if err := os.Remove(pinDir); err != nil {
		return fmt.Errorf("clean up %s: %w", pinDir, err)
	}
	return nil
}

// Pins lists what is pinned in pinDir (links as links/NAME), without the
// kernel's own files of a bpffs root.
func Pins(pinDir string) ([]string, error) {
	var out []string
	entries, err := os.ReadDir(pinDir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	for _, e := range entries {
		switch {
		case e.Name() == linksDir:
			links, _ := os.ReadDir(filepath.Join(pinDir, linksDir))
			for _, l := range links {
				out = append(out, linksDir+"/"+l.Name())
			}
		case !strings.HasSuffix(e.Name(), ".debug"):
			out = append(out, e.Name())
		}
	}
	return out, nil
}

const (
	bpfFSMagic   = 0xcafe4a11
	cgroup2Magic = 0x63677270
)

// ErrPinDirNotShared says the pin dir is not on a bpffs that outlives
// proxyd: pins in a bpffs proxyd mounted in a mount namespace of its own
// die with it, and with them every Service of the node's pods until
// proxyd is back.
var ErrPinDirNotShared = errors.New("the pin dir is not on a bpffs shared with the node")

// ensureBPFFS makes dir exist on a bpffs. Where it is not on one, it
// mounts one on dir itself only when that mount outlives proxyd (see
// mountOutlivesUs); otherwise it refuses, saying why, rather than pin into
// a bpffs that dies with the process.
func ensureBPFFS(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("create pin dir %s: %w", dir, err)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return fmt.Errorf("pin dir %s: %w", dir, err)
	}
	if st.Type == bpfFSMagic {
		return nil
	}
	if why := mountOutlivesUs(dir); why != "" {
		return fmt.Errorf("%w: --bpf-pin-dir %s is not on a bpffs, and one proxyd mounted there would die with it (%s): mount the node's /sys/fs/bpf into proxyd's container (deploy/ebpf does, Bidirectional) or a bpffs on the node (mount -t bpf bpf /sys/fs/bpf)",
			ErrPinDirNotShared, dir, why)
	}
	if err := unix.Mount("bpffs", dir, "bpf", 0, "mode=0700"); err != nil {
		return fmt.Errorf("mount bpffs on pin dir %s: %w", dir, err)
	}
	return nil
}

// nodeMountNS is the node's mount namespace as PID 1 has it (tests point it
// elsewhere).
var nodeMountNS = "/proc/1/ns/mnt"

// mountOutlivesUs says why a mount proxyd made on dir would not outlive
// it ("" when it would): proxyd runs in the node's own mount namespace
// (PID 1's, PID 1 being another process: with hostPID, or on the host;
// when PID 1's cannot be read, proxyd is taken to be on the host unless it
// is PID 1 itself, as the entrypoint of a container without hostPID is), or
// the mount holding dir propagates to its peers (shared, as the node's
// /sys/fs/bpf mounted Bidirectional into a pod).
func mountOutlivesUs(dir string) string {
	self, err1 := os.Readlink("/proc/thread-self/ns/mnt")
	init, err2 := os.Readlink(nodeMountNS)
	switch {
	case err1 == nil && err2 == nil && self == init && os.Getpid() != 1:
		return ""
	case err1 == nil && err2 != nil && os.Getpid() != 1:
		// PID 1 is another process whose namespace this one may not
		// read (a sandboxed host): nothing says proxyd is in a
		// container, so the mount is taken to be the host's, as before.
		return ""
	}
	info, err := os.ReadFile("/proc/thread-self/mountinfo")
	if err != nil {
		return err.Error()
	}
	mp, shared := mountOf(info, dir)
	if shared {
		return ""
	}
	return fmt.Sprintf("proxyd has a mount namespace of its own and its mount %s propagates nowhere", mp)
}

// mountOf finds the mount holding path in a /proc/PID/mountinfo: its
// mount point, and whether it is shared (propagates mounts to its peers).
// The last of the longest matching mount points wins, as the kernel stacks
// them.
func mountOf(mountinfo []byte, path string) (mountPoint string, shared bool) {
	path = filepath.Clean(path)
	for _, line := range strings.Split(string(mountinfo), "\n") {
		f := strings.Fields(line)
		if len(f) < 7 {
			continue
		}
		mp := strings.ReplaceAll(f[4], "\\040", " ")
		if !(path == mp || mp == "/" || strings.HasPrefix(path, mp+"/")) || len(mp) < len(mountPoint) {
			continue
		}
		mountPoint, shared = mp, false
		for _, opt := range f[6:] {
			if opt == "-" {
				break
			}
			shared = shared || strings.HasPrefix(opt, "shared:")
		}
	}
	return mountPoint, shared
}

func isMountPoint(dir string) bool {
	var a, b unix.Stat_t
	if unix.Stat(dir, &a) != nil || unix.Stat(filepath.Dir(dir), &b) != nil {
		return false
	}
	return a.Dev != b.Dev
}

func checkCgroup(dir string) error {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return fmt.Errorf("--bpf-cgroup %s: %w", dir, err)
	}
	if st.Type != cgroup2Magic {
		return fmt.Errorf("--bpf-cgroup %s: not a cgroup v2 directory", dir)
	}
	return nil
}

// tcLinkPin names the pin of prog's link on iface: prog@iface, with the
// dots of a name like podnet.1 written as colons, since bpffs refuses dots
// in names (EPERM) and interface names never hold a colon.
func tcLinkPin(prog, iface string) string {
	return prog + "@" + strings.ReplaceAll(iface, ".", ":")
}

// TCNodePort is the tc program for traffic from outside, on the ingress
// of the node's uplinks and of the pod bridge (replies of local pods).
const TCNodePort = bpf.NodeportProgNodeportIn

// AttachTC attaches the tc program prog (TCNodePort) to the ingress of
// iface through tcx, pinned as links/prog@iface; a link already pinned
// there is updated in place. It needs pinned maps (Open).
func (d *Datapath) AttachTC(prog, iface string) error {
	p := d.np.Programs[prog]
	if p == nil {
		return fmt.Errorf("attach tc program %q: no such program", prog)
	}
	ifc, err := net.InterfaceByName(iface)
	if err != nil {
		return fmt.Errorf("attach %s: %w", prog, err)
	}
	path := filepath.Join(d.pinDir, linksDir, tcLinkPin(prog, iface))
	if l, err := link.LoadPinnedLink(path, nil); err == nil {
		if info, err := l.Info(); err == nil && info.TCX() != nil && int(info.TCX().Ifindex) == ifc.Index {
			if err := l.Update(p); err != nil {
				l.Close()
				return fmt.Errorf("update link %s: %w", path, err)
			}
			d.links = append(d.links, l)
			return nil
		}
		// The interface was recreated: the old link is gone with it.
		_ = l.Unpin()
		l.Close()
	}
	l, err := link.AttachTCX(link.TCXOptions{Interface: ifc.Index, Program: p, Attach: ebpf.AttachTCXIngress})
	if err != nil {
		return fmt.Errorf("attach %s to %s: %w", prog, iface, err)
	}
	if err := l.Pin(path); err != nil {
		l.Close()
		return fmt.Errorf("pin link %s: %w", path, err)
	}
	d.links = append(d.links, l)
	return nil
}
