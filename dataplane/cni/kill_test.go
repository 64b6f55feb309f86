package cni

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/podnet/podnet/dataplane/ipam"
	"github.com/podnet/podnet/dataplane/link"
)

// TestKilledAddsLeaveARecoverableStore SIGKILLs plugin processes at random
// points of 200 ADDs (libcni kills the plugin when its context ends). No
// address may be handed out twice, and after GC with the attachments whose
// ADD succeeded, the store and the kernel hold exactly those.
func TestKilledAddsLeaveARecoverableStore(t *testing.T) {
	t.Parallel()
	n := newTestNode(t, nodeOptions{podCIDR: "10.244.8.0/24"})

	// 20 pods with 10 interfaces each keep namespace churn low.
	const pods, ifsPerPod, workers = 20, 10, 4
	nss := make([]ns.NetNS, pods)
	for i := range nss {
		nss[i] = newNetNS(t, "pod")
	}
	// The kill window tracks how long uninterrupted ADDs take right now
	// (a moving average), so kills land anywhere inside a plugin's run.
	start := time.Now()
	n.mustAdd(nss[0], "calibrate", "cal0")
	window := time.Since(start)
	if err := n.del(nss[0], "calibrate", "cal0"); err != nil {
		t.Fatal(err)
	}

	type job struct {
		pod    int
		cid    string
		ifname string
	}
	jobs := make(chan job)
	var mu sync.Mutex
	ok := map[ipam.Attachment]netip.Addr{}
	podOf := map[ipam.Attachment]int{}
	killed := 0
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for j := range jobs {
				// Half the ADDs may run to the end, the other half are
				// killed at a random point of their run.
				ctx, cancel := context.Background(), context.CancelFunc(func() {})
				mu.Lock()
				timed := rand.N(2) == 0
				if timed {
					ctx, cancel = context.WithTimeout(ctx, rand.N(window))
				}
				mu.Unlock()
				began := time.Now()
				res, err := n.addCtx(ctx, nss[j.pod], j.cid, j.ifname)
				took := time.Since(began)
				cancel()
				att := ipam.Attachment{ContainerID: j.cid, IfName: j.ifname}
				mu.Lock()
				if !timed && err == nil {
					window = (4*window + took) / 5
				}
				podOf[att] = j.pod
				if err != nil {
					killed++
				} else if r, cerr := current.NewResultFromResult(res); cerr == nil {
					a, _ := netip.AddrFromSlice(r.IPs[0].Address.IP)
					ok[att] = a.Unmap()
				}
				mu.Unlock()
			}
		})
	}
	for i := range pods * ifsPerPod {
		jobs <- job{pod: i % pods, cid: fmt.Sprintf("ctr-%d", i), ifname: fmt.Sprintf("eth%d", i/pods)}
	}
	close(jobs)
	wg.Wait()
	t.Logf("%d ADDs succeeded, %d were killed (window %s)", len(ok), killed, window)
	if killed == 0 || len(ok) == 0 {
		t.Fatalf("want both killed and completed ADDs, got %d killed, %d completed", killed, len(ok))
	}
	byAddr := map[netip.Addr]ipam.Attachment{}
	for att, a := range ok {
		if other, dup := byAddr[a]; dup {
			t.Errorf("%s handed out to both %s and %s", a, other, att)
		}
		byAddr[a] = att
	}

	before := len(n.allocations())
	inNS(t, n.ns, func() error {
		veths, err := link.HostVeths()
		t.Logf("before GC: %d allocations, %d host veths", before, len(veths))
		return err
	})

	var valid []types.GCAttachment
	for att := range ok {
		valid = append(valid, types.GCAttachment{ContainerID: att.ContainerID, IfName: att.IfName})
	}
	if err := n.gc(valid, false); err != nil {
		t.Fatalf("GC: %v", err)
	}

	// The store holds exactly the completed attachments, at their addresses.
	al := n.allocations()
	if len(al) != len(ok) {
		t.Errorf("store holds %d allocations after GC, want %d", len(al), len(ok))
	}
	for _, a := range al {
		if want, found := ok[a.Attachment]; !found || want != a.Addr {
			t.Errorf("store has %s for %s, completed ADDs gave %v (found %v)", a.Addr, a.Attachment, want, found)
		}
	}
	// The node holds exactly their host veths.
	wantVeths := map[string]bool{}
	for att := range ok {
		wantVeths[link.HostVethName(att.ContainerID, att.IfName)] = true
	}
	inNS(t, n.ns, func() error {
		veths, err := link.HostVeths()
		if err != nil {
			return err
		}
		if len(veths) != len(wantVeths) {
			t.Errorf("node has %d host veths, want %d", len(veths), len(wantVeths))
		}
		for _, v := range veths {
			if !wantVeths[v.Attrs().Name] {
				t.Errorf("host veth %s belongs to no completed ADD", v.Attrs().Name)
			}
		}
		return nil
	})
	// Every pod interface left is a completed one with its own address.
	seen := map[netip.Addr]string{}
	for i, pod := range nss {
		inNS(t, pod, func() error {
			links, err := netlink.LinkList()
			if err != nil {
				return err
			}
			for _, l := range links {
				if l.Attrs().Name == "lo" {
					continue
				}
				addrs, err := link.Addrs(l, netlink.FAMILY_V4)
				if err != nil {
					return err
				}
				where := fmt.Sprintf("pod %d %s", i, l.Attrs().Name)
				var att ipam.Attachment
				for a, p := range podOf {
					if p == i && a.IfName == l.Attrs().Name {
						if _, done := ok[a]; done {
							att = a
						}
					}
				}
				if att.ContainerID == "" {
					t.Errorf("%s survived GC but its ADD did not complete", where)
					continue
				}
				if len(addrs) != 1 || addrs[0].Addr() != ok[att] {
					t.Errorf("%s has %v, want %s", where, addrs, ok[att])
				}
				for _, a := range addrs {
					if other, dup := seen[a.Addr()]; dup {
						t.Errorf("%s and %s both hold %s", other, where, a.Addr())
					}
					seen[a.Addr()] = where
				}
			}
			return nil
		})
	}
}
