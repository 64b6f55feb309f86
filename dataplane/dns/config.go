package dns

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	mdns "github.com/miekg/dns"
	"sigs.k8s.io/yaml"
)

// FileConfig is dnsd's configuration file, in the terms of the kube-dns
// ConfigMap users carry over (and the Corefile equivalents in comments),
// mounted from a ConfigMap and reloaded when it changes:
//
//	upstreamNameservers: ["10.0.0.53", "10.0.1.53:5353"]  # forward . 10.0.0.53 …
//	stubDomains:                                          # a server block per domain
//	  corp.example: ["10.1.0.53"]                         #   with forward . 10.1.0.53
//	hosts:                                                # hosts { 192.0.2.10 registry.internal }
//	  registry.internal: ["192.0.2.10", "2001:db8::10"]
//	log: {classes: "denial,error", errors: true, rate: 100}  # log { class denial error }; errors
type FileConfig struct {
	// UpstreamNameservers replace the nameservers of resolv.conf (and
	// --upstream) for names outside the cluster and the stub domains.
	UpstreamNameservers []string `json:"upstreamNameservers"`
	// StubDomains forward a domain (and its subdomains) to its own
	// nameservers.
	StubDomains map[string][]string `json:"stubDomains"`
	// Hosts answer A and AAAA for fixed names, before any upstream.
	Hosts map[string][]string `json:"hosts"`
	// Log, when present, replaces the --log-* flags.
	Log *FileLog `json:"log"`
}

// FileLog is query and error logging in the config file.
type FileLog struct {
	// Classes of answers whose queries are logged (ParseLogClasses).
	Classes string `json:"classes"`
	// Errors logs why queries failed.
	Errors bool `json:"errors"`
	// Rate caps the lines per second; 0: DefaultLogRate.
	Rate float64 `json:"rate"`
}

// ParseFileConfig decodes a config file (YAML or JSON); an unknown field or
// a bad value is an error naming it.
func ParseFileConfig(data []byte) (FileConfig, error) {
	var c FileConfig
	if err := yaml.UnmarshalStrict(data, &c); err != nil {
		return FileConfig{}, fmt.Errorf("decode: %w", err)
	}
	if _, err := c.Resolved(); err != nil {
		return FileConfig{}, err
	}
	return c, nil
}

// Resolved is a FileConfig in the forwarder's terms.
type Resolved struct {
	Upstreams []netip.AddrPort
	Stubs     []Stub
	Hosts     map[string][]netip.Addr // by lowercase FQDN
	// Log is the file's logging, nil when it says none (the flags hold).
	Log *LogOptions
}

// Stub forwards one domain to its own upstreams.
type Stub struct {
	Domain    string // lowercase FQDN
	Upstreams []netip.AddrPort
}

// Resolved checks every value and returns them parsed.
func (c FileConfig) Resolved() (Resolved, error) {
	var r Resolved
	var err error
	if r.Upstreams, err = parseNameservers("upstreamNameservers", c.UpstreamNameservers); err != nil {
		return Resolved{}, err
	}
	for domain, servers := range c.StubDomains {
		d, err := fqdn("stubDomains", domain)
		if err != nil {
			return Resolved{}, err
		}
		ups, err := parseNameservers("stubDomains."+domain, servers)
		if err != nil {
			return Resolved{}, err
		}
		if len(ups) == 0 {
			return Resolved{}, fmt.Errorf("stubDomains.%s: no nameservers", domain)
		}
		r.Stubs = append(r.Stubs, Stub{Domain: d, Upstreams: ups})
	}
	// Longest domain first: the most specific stub wins.
	slices.SortFunc(r.Stubs, func(a, b Stub) int {
		if n := len(b.Domain) - len(a.Domain); n != 0 {
			return n
		}
		return strings.Compare(a.Domain, b.Domain)
	})
	if c.Log != nil {
		classes, err := ParseLogClasses(c.Log.Classes)
		if err != nil {
			return Resolved{}, fmt.Errorf("log.classes: %w", err)
		}
		if c.Log.Rate < 0 {
			return Resolved{}, fmt.Errorf("log.rate: %v is negative", c.Log.Rate)
		}
		r.Log = &LogOptions{Queries: classes, Errors: c.Log.Errors, Rate: c.Log.Rate}
	}
	for name, addrs := range c.Hosts {
		n, err := fqdn("hosts", name)
		if err != nil {
			return Resolved{}, err
		}
		if len(addrs) == 0 {
			return Resolved{}, fmt.Errorf("hosts.%s: no addresses", name)
		}
		if r.Hosts == nil {
			r.Hosts = map[string][]netip.Addr{}
		}
		for _, a := range addrs {
			ip, err := netip.ParseAddr(a)
			if err != nil {
				return Resolved{}, fmt.Errorf("hosts.%s: %q is not an IP address", name, a)
			}
			r.Hosts[n] = append(r.Hosts[n], ip.Unmap())
		}
	}
	return r, nil
}

func fqdn(field, name string) (string, error) {
	n := strings.ToLower(mdns.Fqdn(strings.TrimSpace(name)))
	if _, ok := mdns.IsDomainName(n); !ok || n == "." {
		return "", fmt.Errorf("%s: %q is not a domain name", field, name)
	}
	return n, nil
}

func parseNameservers(field string, ss []string) ([]netip.AddrPort, error) {
	var out []netip.AddrPort
	for _, s := range ss {
		s = strings.TrimSpace(s)
		if ap, err := netip.ParseAddrPort(s); err == nil {
			out = append(out, ap)
			continue
		}
		a, err := netip.ParseAddr(s)
		if err != nil {
			return nil, fmt.Errorf("%s: %q is not IP or IP:PORT", field, s)
		}
		out = append(out, netip.AddrPortFrom(a, 53))
	}
	return out, nil
}
