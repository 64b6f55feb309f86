package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/signal"
	"strconv"
	"sync"
	"syscall"
	"time"
)

// mixCounts are one second's results of mix.
type mixCounts struct {
	httpOK, httpFailed, dnsOK, dnsFailed int
}

// mixer counts results per Unix second and prints each second once it is
// over, so a reader can split a run at any instant.
type mixer struct {
	mu  sync.Mutex
	sec map[int64]*mixCounts
	// said is how many failures were printed: the first 200 only.
	said int
}

func (m *mixer) add(at time.Time, f func(*mixCounts), failure string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	c := m.sec[at.Unix()]
	if c == nil {
		c = &mixCounts{}
		m.sec[at.Unix()] = c
	}
	f(c)
	if failure != "" && m.said < 200 {
		m.said++
		fmt.Printf("fail %s %s\n", at.Format("15:04:05.000"), failure)
	}
}

// flush prints every second before now.
func (m *mixer) flush(now int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for s, c := range m.sec {
		if s < now {
			fmt.Printf("%d http %d %d dns %d %d\n", s, c.httpOK, c.httpFailed, c.dnsOK, c.dnsFailed)
			delete(m.sec, s)
		}
	}
}

// mix is the migration test's client: HTTP through url every 20 ms and
// rate DNS lookups a second of names in turn, each lookup in its own
// goroutine so a slow answer (bounded to 2 s, a timeout counts as a
// failure) does not lower the rate, until TERM or INT.
func mix(url, rate string, names []string) error {
	perSec, err := strconv.Atoi(rate)
	if err != nil || perSec < 0 || (perSec > 0) != (len(names) > 0) {
		return fmt.Errorf("mix URL RATE NAME...: rate %q, names %q (RATE 0 and no NAME: HTTP alone)", rate, names)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	m := &mixer{sec: map[int64]*mixCounts{}}
	var wg sync.WaitGroup
	wg.Go(func() { mixHTTP(ctx, m, url) })
	if perSec > 0 {
		wg.Go(func() { mixDNS(ctx, m, perSec, names) })
	}
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case now := <-tick.C:
			m.flush(now.Unix())
		case <-ctx.Done():
			wg.Wait()
			m.flush(time.Now().Unix() + 1)
			fmt.Println("done")
			return nil
		}
	}
}

func mixHTTP(ctx context.Context, m *mixer, url string) {
	c := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	for ctx.Err() == nil {
		start := time.Now()
		resp, err := c.Get(url)
		if err == nil {
			_, err = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if err == nil && resp.StatusCode != http.StatusOK {
				err = fmt.Errorf("%s", resp.Status)
			}
		}
		if err != nil {
			m.add(start, func(c *mixCounts) { c.httpFailed++ }, "http "+err.Error())
		} else {
			m.add(start, func(c *mixCounts) { c.httpOK++ }, "")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func mixDNS(ctx context.Context, m *mixer, perSec int, names []string) {
	r := &net.Resolver{PreferGo: true}
	tick := time.NewTicker(time.Second / time.Duration(perSec))
	defer tick.Stop()
	var wg sync.WaitGroup
	defer wg.Wait()
	for i := 0; ; i++ {
		select {
		case <-ctx.Done():
			return
		case start := <-tick.C:
			name := names[i%len(names)]
			wg.Go(func() {
				lctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				defer cancel()
				if _, err := r.LookupHost(lctx, name); err != nil {
					m.add(start, func(c *mixCounts) { c.dnsFailed++ }, "dns "+name+" "+err.Error())
				} else {
					m.add(start, func(c *mixCounts) { c.dnsOK++ }, "")
				}
			})
		}
	}
}
