package ebpf

import (
	"fmt"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// linkWatch attaches the tc programs the moment an interface they belong
// on appears: the bridge comes with the node's first pod, the VXLAN device
// with its first VXLAN peer, and a full sync may be --sync-period (30 s)
// away. Until the bridge's program is there, replies of the node's pods to
// NodePort traffic are not translated back: a real node's first NodePort
// requests to its own pods timed out.
type linkWatch struct {
	done    chan struct{}
	stopped chan struct{}
}

// watchLinks starts the watch in the network namespace of the calling
// thread (the one Sync runs in); attach runs there, with the link's name,
// on every new or changed link.
func watchLinks(attach func(name string)) (*linkWatch, error) {
	cur, err := ns.GetCurrentNS()
	if err != nil {
		return nil, fmt.Errorf("watch links: %w", err)
	}
	h, err := netns.GetFromPath(cur.Path())
	if err != nil {
		cur.Close()
		return nil, fmt.Errorf("watch links: %w", err)
	}
	w := &linkWatch{done: make(chan struct{}), stopped: make(chan struct{})}
	updates := make(chan netlink.LinkUpdate, 64)
	// A lost event (an overflowed socket) is caught up by the next full
	// sync.
	err = netlink.LinkSubscribeWithOptions(updates, w.done, netlink.LinkSubscribeOptions{Namespace: &h, ErrorCallback: func(error) {}})
	h.Close()
	if err != nil {
		cur.Close()
		return nil, fmt.Errorf("watch links: %w", err)
	}
	go func() {
		defer close(w.stopped)
		defer cur.Close()
		for {
			select {
			case <-w.done:
				return
			case u, ok := <-updates:
				if !ok {
					return
				}
				if u.Header.Type == unix.RTM_NEWLINK && u.Link != nil {
					name := u.Attrs().Name
					_ = cur.Do(func(ns.NetNS) error { attach(name); return nil })
				}
			}
		}
	}()
	return w, nil
}

// stop ends the watch; no attach runs after it returns.
func (w *linkWatch) stop() {
	close(w.done)
	<-w.stopped
}
