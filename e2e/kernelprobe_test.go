package e2e

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"runtime"
	"unsafe"

	"github.com/google/nftables"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/podnet/podnet/dataplane/proxy/ebpf"
)

// kernelProbe reads, from a node's network namespace, what the kernel's
// packet filter holds, cheaply enough to be asked every millisecond: the
// nftables generation (bumped by every committed transaction, whoever
// commits it: nft, iptables-nft-restore, google/nftables) and the number
// of entries of iptables-legacy's nat table. The benchmarks time a proxy
// by these, not by what the proxy says.
type kernelProbe struct {
	ns   *os.File
	nl   *netlink.Conn
	raw4 int // AF_INET raw socket in the namespace, for iptables-legacy's getsockopt
}

func newKernelProbe(nsPath string) (*kernelProbe, error) {
	f, err := os.Open(nsPath)
	if err != nil {
		return nil, err
	}
	p := &kernelProbe{ns: f, raw4: -1}
	p.nl, err = netlink.Dial(unix.NETLINK_NETFILTER, &netlink.Config{NetNS: int(f.Fd())})
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("netfilter netlink in %s: %w", nsPath, err)
	}
	if err := p.openRaw(); err != nil {
		p.Close()
		return nil, err
	}
	return p, nil
}

// openRaw opens the raw socket inside the namespace (a socket keeps the
// namespace it was made in).
func (p *kernelProbe) openRaw() error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // the thread ends with the goroutine, in whichever namespace
		if err := unix.Setns(int(p.ns.Fd()), unix.CLONE_NEWNET); err != nil {
			errc <- err
			return
		}
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_RAW, unix.IPPROTO_RAW)
		p.raw4 = fd
		errc <- err
	}()
	return <-errc
}

func (p *kernelProbe) Close() {
	if p.nl != nil {
		p.nl.Close()
	}
	if p.raw4 >= 0 {
		unix.Close(p.raw4)
	}
	p.ns.Close()
}

// Generation is the namespace's nftables generation (NFT_MSG_GETGEN).
func (p *kernelProbe) Generation() (uint32, error) {
	const subsysNFTables, msgGetGen, msgNewGen, attrGenID = 10, 16, 15, 1
	msgs, err := p.nl.Execute(netlink.Message{
		Header: netlink.Header{Type: netlink.HeaderType(subsysNFTables<<8 | msgGetGen), Flags: netlink.Request},
		Data:   []byte{unix.AF_UNSPEC, 0, 0, 0}, // nfgenmsg: family, version, res_id
	})
	if err != nil {
		return 0, fmt.Errorf("getgen: %w", err)
	}
	for _, m := range msgs {
		if m.Header.Type&0xff != msgNewGen || len(m.Data) < 4 {
			continue
		}
		ad, err := netlink.NewAttributeDecoder(m.Data[4:])
		if err != nil {
			return 0, err
		}
		ad.ByteOrder = binary.BigEndian
		for ad.Next() {
			if ad.Type() == attrGenID {
				return ad.Uint32(), nil
			}
		}
	}
	return 0, errors.New("getgen: no generation in the answer")
}

// LegacyNATEntries is the number of entries of iptables-legacy's IPv4 nat
// table (IPT_SO_GET_INFO), 0 if it does not exist.
func (p *kernelProbe) LegacyNATEntries() (int, error) {
	const iptSoGetInfo = 64
	var info struct {
		Name       [32]byte
		ValidHooks uint32
		HookEntry  [5]uint32
		Underflow  [5]uint32
		NumEntries uint32
		Size       uint32
	}
	copy(info.Name[:], "nat")
	size := uint32(unsafe.Sizeof(info))
	_, _, errno := unix.Syscall6(unix.SYS_GETSOCKOPT, uintptr(p.raw4), unix.IPPROTO_IP, iptSoGetInfo,
		uintptr(unsafe.Pointer(&info)), uintptr(unsafe.Pointer(&size)), 0)
	switch {
	case errno == unix.ENOENT:
		return 0, nil
	case errno != 0:
		return 0, fmt.Errorf("getsockopt IPT_SO_GET_INFO nat: %w", errno)
	}
	return int(info.NumEntries), nil
}

// NFTChains counts the chains of the nftables table family/name.
func (p *kernelProbe) NFTChains(family nftables.TableFamily, table string) (int, error) {
	n := 0
	err := p.eachNFTChain(family, table, func(*nftables.Conn, *nftables.Chain) error { n++; return nil })
	return n, err
}

// NFTRules counts the rules of the nftables table family/name.
func (p *kernelProbe) NFTRules(family nftables.TableFamily, table string) (int, error) {
	n := 0
	err := p.eachNFTChain(family, table, func(c *nftables.Conn, ch *nftables.Chain) error {
		rules, err := c.GetRules(ch.Table, ch)
		n += len(rules)
		return err
	})
	return n, err
}

// eachNFTChain calls fn with each chain of the nftables table family/name,
// over one netlink connection in the probe's namespace.
func (p *kernelProbe) eachNFTChain(family nftables.TableFamily, table string, fn func(*nftables.Conn, *nftables.Chain) error) error {
	c, err := nftables.New(nftables.WithNetNSFd(int(p.ns.Fd())))
	if err != nil {
		return err
	}
	defer c.CloseLasting()
	chains, err := c.ListChainsOfTableFamily(family)
	if err != nil {
		return err
	}
	for _, ch := range chains {
		if ch.Table.Name != table {
			continue
		}
		if err := fn(c, ch); err != nil {
			return err
		}
	}
	return nil
}

// ebpfFrontends counts the frontends of the Service maps pinned in pinDir.
func ebpfFrontends(pinDir string) (int, error) {
	p, err := ebpf.ReadPinned(pinDir)
	if err != nil {
		return 0, err
	}
	return len(p.Frontends), nil
}
