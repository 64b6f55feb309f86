package corefile

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// builtin are plugins dnsd does itself, whatever the Corefile says of them.
var builtin = map[string]string{
	"health": "dnsd's /health (--health-address); lameduck is dnsd's drain until quiet (--drain-quiet, --drain-max)",
	"ready":  "dnsd's /ready (--ready-address)",
	"loop":   "dnsd detects forwarding loops itself",
	"reload": "dnsd reloads its config file instead",
}

// root converts the root zone's server block.
func (c *converter) root(b ServerBlock) {
	for _, d := range b.Directives {
		if d.Name == "kubernetes" {
			c.clusterZones = append(c.clusterZones, d.Args...)
		}
	}
	for _, d := range b.Directives {
		switch d.Name {
		case "health", "ready", "loop", "reload":
			c.note(d, builtin[d.Name])
		case "prometheus":
			if len(d.Args) > 0 {
				c.flag("--metrics-address=" + d.Args[0])
			}
		case "errors":
			c.flag("--log-errors")
		case "log":
			c.flag("--log-queries=all")
		case "autopath":
			c.flag("--autopath")
		case "cache":
			c.cache(d)
		case "forward":
			c.forward(d, "")
		case "hosts":
			c.hosts(d)
		case "kubernetes":
			c.kubernetes(d)
		case "loadbalance":
			c.refuse(d, "answers keep the index's order")
		default:
			c.refuse(d, "no equivalent in dnsd")
		}
	}
}

// stub converts a server block of another zone: a stub domain.
func (c *converter) stub(zone string, b ServerBlock) {
	for _, d := range b.Directives {
		switch d.Name {
		case "forward":
			c.forward(d, zone)
		case "errors", "cache", "log", "loop", "reload":
			c.note(d, "dnsd's setting for every zone applies")
		default:
			c.refuse(d, "no equivalent in a dnsd stub domain")
		}
	}
}

// forward: upstreams of the root zone, or of a stub domain; its options
// where dnsd has them.
func (c *converter) forward(d Directive, zone string) {
	if len(d.Args) < 2 {
		c.refuse(d, "wants FROM and at least one upstream")
		return
	}
	from := strings.TrimSuffix(d.Args[0], ".") + "."
	if from == ".." {
		from = "."
	}
	ups, bad := upstreams(d.Args[1:])
	switch {
	case bad != "":
		c.refuse(d, bad)
		return
	case zone == "" && from != ".":
		zone = from
	}
	if zone == "" {
		c.out.Config.UpstreamNameservers = ups
	} else {
		if len(ups) == 0 {
			c.refuse(d, "a stub domain forwarded to /etc/resolv.conf")
			return
		}
		if c.out.Config.StubDomains == nil {
			c.out.Config.StubDomains = map[string][]string{}
		}
		c.out.Config.StubDomains[strings.TrimSuffix(zone, ".")] = ups
	}
	for _, o := range d.Block {
		switch {
		case o.Name == "max_concurrent" && len(o.Args) == 1 && zone == "":
			c.flag("--max-concurrent=" + o.Args[0])
		case o.Name == "policy" && len(o.Args) == 1 && zone == "":
			c.flag("--policy=" + o.Args[0])
		default:
			c.refuse(o, "forward option dnsd does not have here")
		}
	}
}

// hosts: an inline map only.
func (c *converter) hosts(d Directive) {
	if len(d.Args) > 0 && d.Args[0] != "" {
		c.refuse(d, "a hosts file: dnsd takes inline entries only")
		return
	}
	for _, e := range d.Block {
		if e.Name == "fallthrough" || e.Name == "ttl" || e.Name == "reload" || e.Name == "no_reverse" {
			c.note(e, "hosts option left out: dnsd's hosts answer and fall through to the upstreams")
			continue
		}
		if c.out.Config.Hosts == nil {
			c.out.Config.Hosts = map[string][]string{}
		}
		for _, name := range e.Args {
			c.out.Config.Hosts[name] = append(c.out.Config.Hosts[name], e.Name)
		}
	}
}

// cache [TTL] {success N; denial N; prefetch N; serve_stale; disable
// success|denial ZONES}: dnsd's cache flags (its defaults are kubeadm's
// cache 30). disable for zones the kubernetes plugin serves (kubeadm's
// Corefile since v1.36 says `disable success cluster.local` and `disable
// denial cluster.local`) is what dnsd does anyway: it answers its own zones
// from its index and caches forwarded answers only; any other zone is
// refused.
func (c *converter) cache(d Directive) {
	if len(d.Args) > 0 && d.Args[0] != "30" {
		c.flag("--cache-max-ttl=" + d.Args[0] + "s")
		c.flag("--cache-max-negative-ttl=" + d.Args[0] + "s")
	}
	for _, o := range d.Block {
		switch {
		case o.Name == "prefetch" && len(o.Args) >= 1:
			c.flag("--prefetch=" + o.Args[0])
		case o.Name == "serve_stale":
			dur := "1h"
			if len(o.Args) > 0 {
				dur = o.Args[0]
			}
			c.flag("--serve-stale=" + dur)
		case (o.Name == "success" || o.Name == "denial") && len(o.Args) >= 1:
			if n, err := strconv.Atoi(o.Args[0]); err == nil && o.Name == "success" {
				c.flag(fmt.Sprintf("--cache-size=%d", n))
			}
		case o.Name == "disable" && len(o.Args) >= 2 && (o.Args[0] == "success" || o.Args[0] == "denial") && c.inClusterZones(o.Args[1:]):
			c.note(o, "dnsd never caches the answers of its own zones")
		default:
			c.refuse(o, "cache option dnsd does not have")
		}
	}
}

// kubernetes ZONES {pods MODE; ttl N; fallthrough ZONES}.
func (c *converter) kubernetes(d Directive) {
	if len(d.Args) > 0 && strings.TrimSuffix(d.Args[0], ".") != "cluster.local" {
		c.flag("--cluster-domain=" + strings.TrimSuffix(d.Args[0], "."))
	}
	for _, o := range d.Block {
		switch {
		case o.Name == "pods" && len(o.Args) == 1:
			c.flag("--pods=" + o.Args[0])
		case o.Name == "ttl" && len(o.Args) == 1:
			c.flag("--ttl=" + o.Args[0])
		case o.Name == "fallthrough":
			c.note(o, "dnsd forwards names outside its zones, reverse ones included")
		default:
			c.refuse(o, "kubernetes option dnsd does not have")
		}
	}
}

// inClusterZones says whether every zone is, or is below, a zone of the
// kubernetes plugin.
func (c *converter) inClusterZones(zones []string) bool {
	for _, z := range zones {
		z = strings.ToLower(strings.TrimSuffix(z, "."))
		if !slices.ContainsFunc(c.clusterZones, func(k string) bool {
			k = strings.ToLower(strings.TrimSuffix(k, "."))
			return z == k || strings.HasSuffix(z, "."+k)
		}) {
			return false
		}
	}
	return true
}
