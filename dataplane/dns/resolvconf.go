package dns

import (
	"bufio"
	"fmt"
	"net/netip"
	"os"
	"strings"
)

// ReadResolvConf returns the nameservers of a resolv.conf, port 53.
func ReadResolvConf(path string) ([]netip.AddrPort, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("read resolv.conf: %w", err)
	}
	defer f.Close()
	var out []netip.AddrPort
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) >= 2 && fields[0] == "nameserver" {
			a, err := netip.ParseAddr(fields[1])
			if err != nil {
				continue
			}
			out = append(out, netip.AddrPortFrom(a, 53))
		}
	}
	return out, sc.Err()
}

// ReadResolvSearch returns the search domains of a resolv.conf (its last
// search line, as the resolver reads it), lowercase, without trailing dots.
func ReadResolvSearch(path string) ([]string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read resolv.conf: %w", err)
	}
	var out []string
	for _, line := range strings.Split(string(data), "\n") {
		fields := strings.Fields(line)
		if len(fields) == 0 || fields[0] != "search" {
			continue
		}
		out = out[:0]
		for _, d := range fields[1:] {
			if d = strings.ToLower(strings.Trim(d, ".")); d != "" {
				out = append(out, d)
			}
		}
	}
	return out, nil
}
