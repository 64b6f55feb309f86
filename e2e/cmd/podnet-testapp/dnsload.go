package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	mdns "github.com/miekg/dns"
	"golang.org/x/net/ipv4"
	"golang.org/x/net/ipv6"
)

// gapReport is the longest time without an answer dnsload lets pass
// without a "gap" line.
const gapReport = 100 * time.Millisecond

// lateReport is the longest a lookup may take to be answered without a
// "late" line: whether a gap was queries held somewhere or a client that
// sent nothing.
const lateReport = 250 * time.Millisecond

// nameserver is the first nameserver of /etc/resolv.conf (the pod's
// cluster DNS address), as HOST:53.
func nameserver() (string, error) {
	f, err := os.Open("/etc/resolv.conf")
	if err != nil {
		return "", err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if fl := strings.Fields(sc.Text()); len(fl) >= 2 && fl[0] == "nameserver" {
			if a, err := netip.ParseAddr(fl[1]); err == nil {
				return netip.AddrPortFrom(a, 53).String(), nil
			}
		}
	}
	return "", errors.New("no nameserver in /etc/resolv.conf")
}

// dnsCounts are one second's lookups of dnsload, per protocol.
type dnsCounts struct{ udpOK, udpFailed, tcpOK, tcpFailed int }

// dnsLoad counts dnsload's lookups per Unix second of their start and
// keeps when the last answer came, to report gaps.
type dnsLoad struct {
	mu   sync.Mutex
	sec  map[int64]*dnsCounts
	said int
	late int
	// last is the Unix nanosecond of the latest answer.
	last atomic.Int64
}

func (d *dnsLoad) add(start time.Time, proto, name string, err error) {
	now := time.Now()
	took := now.Sub(start)
	if err == nil {
		ns := now.UnixNano()
		if prev := d.last.Swap(max(ns, d.last.Load())); prev != 0 && time.Duration(ns-prev) > gapReport {
			fmt.Printf("gap %d %d\n", prev/1e6, ns/1e6)
		}
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if err == nil && took > lateReport && d.late < 2000 {
		d.late++
		fmt.Printf("late %d %s %s %dms\n", start.UnixMilli(), proto, name, took.Milliseconds())
	}
	c := d.sec[start.Unix()]
	if c == nil {
		c = &dnsCounts{}
		d.sec[start.Unix()] = c
	}
	switch {
	case proto == "udp" && err == nil:
		c.udpOK++
	case proto == "udp":
		c.udpFailed++
	case err == nil:
		c.tcpOK++
	default:
		c.tcpFailed++
	}
	if err != nil && d.said < 5000 {
		d.said++
		fmt.Printf("fail %d %s %s %v (after %dms)\n", start.UnixMilli(), proto, name, err, took.Milliseconds())
	}
}

// flush prints every second before now: "T udp OK FAILED tcp OK FAILED".
// Lookups of a second that end after its line get another line for it
// later: a reader adds them up.
func (d *dnsLoad) flush(now int64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for s, c := range d.sec {
		if s < now {
			fmt.Printf("%d udp %d %d tcp %d %d\n", s, c.udpOK, c.udpFailed, c.tcpOK, c.tcpFailed)
			delete(d.sec, s)
		}
	}
}

// dnsload sends rate lookups a second over UDP and as many over TCP to the
// pod's nameserver, each from a new socket with one try of 2 s (a lost UDP
// query costs glibc 5 s; here it is a failure), of the names in turn with
// query type qtype, for dur (0: until TERM or INT). A lookup succeeds when
// its answer comes with NOERROR. It prints a line a second (dnsLoad.flush),
// a "fail UNIXMS PROTO NAME ERROR (after MSms)" line per failure (the first
// 5,000), a "late UNIXMS PROTO NAME MSms" line per lookup answered after more
// than 250 ms (the first 2,000), and a "gap FROMMS TOMS" line whenever more
// than 100 ms passed without an answer, then "done".
func dnsload(rate, dur, qtype string, names []string) error {
	perSec, err := strconv.Atoi(rate)
	d, derr := time.ParseDuration(dur)
	qt, ok := mdns.StringToType[strings.ToUpper(qtype)]
	if err != nil || perSec < 1 || derr != nil || !ok || len(names) == 0 {
		return fmt.Errorf("dnsload RATE DUR TYPE NAME...: rate %q, duration %q, type %q, names %q", rate, dur, qtype, names)
	}
	server, err := nameserver()
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if d > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, d)
		defer cancel()
	}
	l := &dnsLoad{sec: map[int64]*dnsCounts{}}
	var wg sync.WaitGroup
	for _, proto := range []string{"udp", "tcp"} {
		wg.Go(func() { l.send(ctx, server, proto, perSec, qt, names) })
	}
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case now := <-tick.C:
			l.flush(now.Unix())
		case <-ctx.Done():
			wg.Wait()
			l.flush(time.Now().Unix() + 1)
			fmt.Println("done")
			return nil
		}
	}
}

// send starts perSec lookups a second over proto, each in its own
// goroutine so that a slow answer does not lower the rate.
func (l *dnsLoad) send(ctx context.Context, server, proto string, perSec int, qt uint16, names []string) {
	tick := time.NewTicker(time.Second / time.Duration(perSec))
	defer tick.Stop()
	var wg sync.WaitGroup
	defer wg.Wait()
	for i := 0; ; i++ {
		select {
		case <-ctx.Done():
			return
		case start := <-tick.C:
			name := mdns.Fqdn(names[i%len(names)])
			wg.Go(func() { l.add(start, proto, name, askOnce(server, proto, name, qt)) })
		}
	}
}

// askOnce asks server once, from a new socket, waiting 2 s.
func askOnce(server, proto, name string, qt uint16) error {
	c := &mdns.Client{Net: proto, Timeout: 2 * time.Second}
	q := new(mdns.Msg).SetQuestion(name, qt)
	m, _, err := c.Exchange(q, server)
	if err != nil {
		return err
	}
	if m.Rcode != mdns.RcodeSuccess {
		return fmt.Errorf("rcode %s", mdns.RcodeToString[m.Rcode])
	}
	return nil
}

// pairs is glibc's default lookup, the A and AAAA queries of name sent
// together from one new UDP socket (one sendmmsg), by workers goroutines
// back to back for dur; both answers are awaited 5 s. It prints
// "pairs N slow S failed F max MS": S the lookups whose two answers took
// more than 1 s, F those that did not get both.
func pairs(dur, workers, name string) error {
	d, err := time.ParseDuration(dur)
	n, nerr := strconv.Atoi(workers)
	if err != nil || nerr != nil || n < 1 || name == "" {
		return fmt.Errorf("pairs DUR WORKERS NAME: %q %q %q", dur, workers, name)
	}
	server, err := nameserver()
	if err != nil {
		return err
	}
	var total, slow, failed, maxMS atomic.Int64
	var wg sync.WaitGroup
	end := time.Now().Add(d)
	for range n {
		wg.Go(func() {
			for time.Now().Before(end) {
				start := time.Now()
				err := askPair(server, mdns.Fqdn(name))
				took := time.Since(start)
				total.Add(1)
				if err != nil {
					if failed.Add(1) <= 20 {
						fmt.Printf("fail %s %v\n", start.Format("15:04:05.000"), err)
					}
				}
				if took > time.Second {
					slow.Add(1)
				}
				for ms := took.Milliseconds(); ms > maxMS.Load(); {
					if maxMS.CompareAndSwap(maxMS.Load(), ms) {
						break
					}
				}
			}
		})
	}
	wg.Wait()
	fmt.Printf("pairs %d slow %d failed %d max %d\n", total.Load(), slow.Load(), failed.Load(), maxMS.Load())
	return nil
}

// askPair sends the A and AAAA queries of name in one sendmmsg from a new
// UDP socket and waits up to 5 s for both answers.
func askPair(server, name string) error {
	c, err := net.Dial("udp", server)
	if err != nil {
		return err
	}
	conn := c.(*net.UDPConn)
	defer conn.Close()
	ids := map[uint16]bool{}
	var bufs [][]byte
	for _, qt := range []uint16{mdns.TypeA, mdns.TypeAAAA} {
		q := new(mdns.Msg).SetQuestion(name, qt)
		pkt, err := q.Pack()
		if err != nil {
			return err
		}
		ids[q.Id] = true
		bufs = append(bufs, pkt)
	}
	if err := writeBoth(conn, bufs); err != nil {
		return err
	}
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 1500)
	for len(ids) > 0 {
		n, err := conn.Read(buf)
		if err != nil {
			return fmt.Errorf("%d of 2 answers: %w", 2-len(ids), err)
		}
		var m mdns.Msg
		if m.Unpack(buf[:n]) == nil {
			delete(ids, m.Id)
		}
	}
	return nil
}

// writeBoth sends both datagrams in one sendmmsg, on a socket of either
// family.
func writeBoth(conn *net.UDPConn, bufs [][]byte) error {
	var sent int
	var err error
	if conn.RemoteAddr().(*net.UDPAddr).IP.To4() != nil {
		msgs := []ipv4.Message{{Buffers: bufs[:1]}, {Buffers: bufs[1:]}}
		sent, err = ipv4.NewPacketConn(conn).WriteBatch(msgs, 0)
	} else {
		msgs := []ipv6.Message{{Buffers: bufs[:1]}, {Buffers: bufs[1:]}}
		sent, err = ipv6.NewPacketConn(conn).WriteBatch(msgs, 0)
	}
	if err == nil && sent != 2 {
		err = fmt.Errorf("sendmmsg sent %d of 2", sent)
	}
	return err
}

// lookups resolves name count times, one after the other, through the Go
// resolver and /etc/resolv.conf (its search path and ndots, as a pod's
// libc does), and prints "ok N failed M".
func lookups(count, name string) error {
	n, err := strconv.Atoi(count)
	if err != nil || n < 1 || name == "" {
		return fmt.Errorf("lookups COUNT NAME: %q %q", count, name)
	}
	r := &net.Resolver{PreferGo: true}
	ok, failed := 0, 0
	for range n {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := r.LookupHost(ctx, name)
		cancel()
		if err != nil {
			failed++
			fmt.Println("fail", err)
			continue
		}
		ok++
	}
	fmt.Printf("ok %d failed %d\n", ok, failed)
	return nil
}
