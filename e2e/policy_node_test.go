package e2e

import (
	"fmt"
	"net"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/podnet/podnet/dataplane/cluster"
	"github.com/podnet/podnet/dataplane/policy"
)

// nodeReachesOwnPods: red's pods are isolated for ingress (deny-in), yet
// each node reaches its own red pod on TCP and UDP, as kubelet's probes
// must; the other node, whose packets the forward hook judges like any
// peer's, does not (else the check would prove nothing).
func (c *polCluster) nodeReachesOwnPods(t *testing.T) {
	for _, red := range c.pods[:2] {
		if red.ns != "red" {
			t.Fatalf("pod %s is not red's", red.key())
		}
		own, other := c.svc.lab.Node(red.node), c.svc.lab.Node(map[string]string{"node1": "node2", "node2": "node1"}[red.node])
		for _, pp := range []struct {
			proto string
			port  int
		}{{"tcp", polTCP}, {"udp", polUDP}} {
			addr := net.JoinHostPort(red.pod.IPOf(c.family).String(), fmt.Sprint(pp.port))
			out, err := own.Probe(t.Context(), pp.proto, addr)
			if err != nil || !strings.HasPrefix(out, red.key()+" ") {
				t.Errorf("%s -> %s %s: %q %v, want reached (the node's own pod)", own.Name, red.key(), pp.proto, out, err)
			}
			if out, err := other.Probe(t.Context(), pp.proto, addr); err == nil {
				t.Errorf("%s -> %s %s reached (%q): deny-in does not hold for another node, so the check above proves nothing", other.Name, red.key(), pp.proto, out)
			}
		}
	}
}

// deniedLogLine matches proxyd's log line of one denied connection.
var deniedLogLine = regexp.MustCompile(`msg="network policy denied a new connection".*`)

// deniedLogged is proxyd's log lines of denied connections from src to
// dst on port.
func deniedLogged(out string, src, dst *polPod, port int) []string {
	var lines []string
	for _, l := range deniedLogLine.FindAllString(out, -1) {
		if strings.Contains(l, " src="+src.key()+" ") && strings.Contains(l, " dst="+dst.key()+" ") && strings.Contains(l, fmt.Sprintf(" port=%d ", port)) {
			lines = append(lines, l)
		}
	}
	return lines
}

// deniedLog: blue/b sends UDP datagrams from many source ports to red/a,
// whose ingress only green's TCP may reach; each is a new connection the
// table drops. red/a's node's proxyd logs them naming both pods, the port,
// the direction and the policies that select red/a for ingress, and the
// kernel's limit (10 a second, burst 10) caps the lines. A marker sent after
// the burst, until it is logged, shows the log has caught up (nflog keeps
// order) before the lines are counted. Only lines after the burst's start
// count: the matrix's probes of the same flow were logged too.
func (c *polCluster) deniedLog(t *testing.T) {
	red, blue := c.pods[0], c.pods[5]
	if red.key() != "red/a" || blue.key() != "blue/b" {
		t.Fatalf("pods %s, %s: want red/a, blue/b", red.key(), blue.key())
	}
	flow := policy.Flow{Src: blue.pod.IPOf(c.family), Dst: red.pod.IPOf(c.family), Protocol: cluster.UDP, Port: polUDP}
	v := c.model.Evaluate(flow)
	if v.Allowed || len(v.Ingress) < 2 {
		t.Fatalf("the model says %+v: want denied at ingress by red's two policies", v)
	}
	proxyd := c.svc.proxyd[red.node]
	// The matrix's probes of the same flow were logged before.
	before := len(proxyd.Output())
	const sent = 200
	start := time.Now()
	c.sendUDP(t, blue, red, polUDP, sent)
	elapsed := time.Since(start)
	const marker = 9999
	waitUntil(t, 30*time.Second, func() bool {
		c.sendUDP(t, blue, red, marker, 1)
		return len(deniedLogged(proxyd.Output(), blue, red, marker)) > 0
	}, "the marker's denied line in "+red.node+"'s proxyd log")
	lines := deniedLogged(proxyd.Output()[before:], blue, red, polUDP)
	t.Logf("%d datagrams in %v, %d logged; first: %s", sent, elapsed.Round(time.Millisecond), len(lines), strings.Join(lines[:min(1, len(lines))], ""))
	if len(lines) == 0 {
		t.Fatalf("no denied line for %s -> %s udp/%d in %s's proxyd log", blue.key(), red.key(), polUDP, red.node)
	}
	// The bucket holds 10 and gains 10 a second; a second of slack.
	if most := 10 + int(10*(elapsed.Seconds()+1)); len(lines) > most {
		t.Errorf("%d lines for %d denied connections in %v: the rate limit allows %d", len(lines), sent, elapsed, most)
	}
	for _, want := range []string{"direction=ingress", "protocol=UDP", "srcIP=" + flow.Src.String(), "dstIP=" + flow.Dst.String()} {
		if !strings.Contains(lines[0], " "+want) {
			t.Errorf("the line lacks %s: %s", want, lines[0])
		}
	}
	for _, k := range v.Ingress {
		if !strings.Contains(lines[0], k.String()) {
			t.Errorf("the line does not name policy %s: %s", k, lines[0])
		}
	}
}

// sendUDP sends n datagrams from src's network namespace to dst's port,
// each from a socket (and source port) of its own: n new connections.
func (c *polCluster) sendUDP(t *testing.T, src, dst *polPod, port, n int) {
	addr := net.JoinHostPort(dst.pod.IPOf(c.family).String(), fmt.Sprint(port))
	if err := ns.WithNetNSPath(src.pod.NSPath(), func(ns.NetNS) error {
		for range n {
			conn, err := net.Dial("udp", addr)
			if err != nil {
				return err
			}
			_, err = conn.Write([]byte("denied?\n"))
			conn.Close()
			if err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}
