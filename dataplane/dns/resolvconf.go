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
