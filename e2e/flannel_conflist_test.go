package e2e

import (
	"encoding/json"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/containernetworking/plugins/plugins/ipam/host-local/backend/allocator"
)

// flannelConflistScript writes, once flanneld has written
// /run/flannel/subnet.env, the conflist flannel's CNI plugin would hand
// the bridge plugin: host-local gets one range per family subnet.env
// gives (FLANNEL_SUBNET, FLANNEL_IPV6_SUBNET: the node's podCIDRs), a
// route to each family's cluster network (FLANNEL_NETWORK,
// FLANNEL_IPV6_NETWORK), and flannel's MTU. subnet.env holds each
// subnet's first address (10.244.1.1/24, fd00:10:244:1::1/64); host-local
// wants the subnet's own address, which is that one less, whatever the
// prefix length (the last byte or 16-bit group never borrows: it is at
// least 1).
const flannelConflistScript = `while [ ! -s /run/flannel/subnet.env ]; do sleep 1; done
. /run/flannel/subnet.env
# the subnet of the address one past its start: a.b.c.(d-1)/len, x:...:(y-1)/len
subnet() {
  addr=${1%/*} len=${1#*/}
  case $addr in
    *:*) last=${addr##*:} head=${addr%:*}; printf '%s:%x/%s' "$head" $((0x$last - 1)) "$len" ;;
    *) last=${addr##*.} head=${addr%.*}; printf '%s.%d/%s' "$head" $((last - 1)) "$len" ;;
  esac
}
ranges= routes=
for sn in "${FLANNEL_SUBNET:-}" "${FLANNEL_IPV6_SUBNET:-}"; do
  [ -n "$sn" ] || continue
  ranges="$ranges${ranges:+, }[{\"subnet\": \"$(subnet "$sn")\"}]"
done
for nw in "${FLANNEL_NETWORK:-}" "${FLANNEL_IPV6_NETWORK:-}"; do
  [ -n "$nw" ] || continue
  routes="$routes${routes:+, }{\"dst\": \"$nw\"}"
done
cat > /etc/cni/net.d/.10-flannel.conflist <<EOF
{"name": "cbr0", "cniVersion": "0.3.1", "plugins": [
  {"type": "bridge", "name": "cbr0", "bridge": "cni0", "mtu": ${FLANNEL_MTU}, "ipMasq": false,
   "isGateway": true, "isDefaultGateway": true, "hairpinMode": true,
   "ipam": {"type": "host-local", "ranges": [$ranges], "routes": [$routes]}},
  {"type": "portmap", "capabilities": {"portMappings": true}}]}
EOF
mv /etc/cni/net.d/.10-flannel.conflist /etc/cni/net.d/10-flannel.conflist`

// TestFlannelConflistScript runs the flannel lab's conflist script (sh, as
// in its Debian image) on subnet.env files as flanneld writes them, IPv4,
// IPv6 and dual-stack, /24s and others: host-local accepts every range
// (no host bits set) and gets each family's subnet and cluster route.
func TestFlannelConflistScript(t *testing.T) {
	for _, tc := range []struct {
		name, env     string
		subnets, dsts []string
	}{
		{"ipv4 /24", "FLANNEL_NETWORK=10.244.0.0/16\nFLANNEL_SUBNET=10.244.1.1/24\nFLANNEL_MTU=1450\nFLANNEL_IPMASQ=true\n",
			[]string{"10.244.1.0/24"}, []string{"10.244.0.0/16"}},
		{"ipv4 /25 upper half", "FLANNEL_NETWORK=10.244.0.0/16\nFLANNEL_SUBNET=10.244.7.129/25\nFLANNEL_MTU=1450\n",
			[]string{"10.244.7.128/25"}, []string{"10.244.0.0/16"}},
		{"ipv6 only", "FLANNEL_IPV6_NETWORK=fd00:10:244::/56\nFLANNEL_IPV6_SUBNET=fd00:10:244:a::1/64\nFLANNEL_MTU=1430\n",
			[]string{"fd00:10:244:a::/64"}, []string{"fd00:10:244::/56"}},
		{"dual-stack", "FLANNEL_NETWORK=10.244.0.0/16\nFLANNEL_SUBNET=10.244.2.1/24\nFLANNEL_IPV6_NETWORK=fd00:10:244::/56\nFLANNEL_IPV6_SUBNET=fd00:10:244:2::1/64\nFLANNEL_MTU=1450\n",
			[]string{"10.244.2.0/24", "fd00:10:244:2::/64"}, []string{"10.244.0.0/16", "fd00:10:244::/56"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			for _, d := range []string{"run/flannel", "etc/cni/net.d"} {
				if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
					t.Fatal(err)
				}
			}
			if err := os.WriteFile(filepath.Join(root, "run/flannel/subnet.env"), []byte(tc.env), 0o644); err != nil {
				t.Fatal(err)
			}
			script := strings.NewReplacer("/run/flannel/", root+"/run/flannel/", "/etc/cni/net.d/", root+"/etc/cni/net.d/").Replace(flannelConflistScript)
			if out, err := exec.Command("/bin/sh", "-c", script).CombinedOutput(); err != nil {
				t.Fatalf("%v: %s", err, out)
			}
			b, err := os.ReadFile(filepath.Join(root, "etc/cni/net.d/10-flannel.conflist"))
			if err != nil {
				t.Fatal(err)
			}
			var list struct {
				CNIVersion string            `json:"cniVersion"`
				Name       string            `json:"name"`
				Plugins    []json.RawMessage `json:"plugins"`
			}
			if err := json.Unmarshal(b, &list); err != nil || len(list.Plugins) != 2 {
				t.Fatalf("conflist %s: %v", b, err)
			}
			// host-local reads the bridge plugin's configuration as the
			// runtime hands it over: the list's name and version added.
			var bridge map[string]any
			if err := json.Unmarshal(list.Plugins[0], &bridge); err != nil {
				t.Fatal(err)
			}
			bridge["cniVersion"], bridge["name"] = list.CNIVersion, list.Name
			conf, err := json.Marshal(bridge)
			if err != nil {
				t.Fatal(err)
			}
			ipam, _, err := allocator.LoadIPAMConfig(conf, "")
			if err != nil {
				t.Fatalf("host-local refuses %s: %v", conf, err)
			}
			var subnets, dsts []string
			for _, r := range ipam.Ranges {
				for _, rr := range r {
					subnets = append(subnets, (*net.IPNet)(&rr.Subnet).String())
				}
			}
			for _, r := range ipam.Routes {
				dsts = append(dsts, r.Dst.String())
			}
			if !slices.Equal(subnets, tc.subnets) || !slices.Equal(dsts, tc.dsts) {
				t.Errorf("ranges %v, routes %v; want %v, %v\n%s", subnets, dsts, tc.subnets, tc.dsts, b)
			}
		})
	}
}
