package cluster

import (
	"net"
	"net/netip"
	"strings"
	"testing"
)

// TestFlannelAnnotationsRoundTrip: what podnet writes for its Node reads
// back as flannel's vxlan backend with that VNI, MAC and public IP, per
// family; what is wrong is named by annotation.
func TestFlannelAnnotationsRoundTrip(t *testing.T) {
	mac, _ := net.ParseMAC("0e:70:c0:a8:0a:0b")
	for _, ip := range []netip.Addr{netip.MustParseAddr("192.168.10.11"), netip.MustParseAddr("fd00:10::11")} {
		a := FlannelAnnotations(1, mac, ip)
		f := ParseFlannel(a)
		if f == nil || f.Err != "" || f.Backend != FlannelBackendVXLAN || f.VNI != 1 {
			t.Fatalf("%v: %+v from %v", ip, f, a)
		}
		gotIP, gotMAC := f.PublicIP, f.VTEPMAC
		if ip.Is6() {
			gotIP, gotMAC = f.PublicIPv6, f.VTEPMACv6
		}
		if gotIP != ip || gotMAC.String() != mac.String() {
			t.Errorf("%v: read back %v %v", ip, gotIP, gotMAC)
		}
	}
	for key, val := range map[string]string{
		FlannelBackendData: `{"VNI":1,"VtepMAC":"zz"}`,
		FlannelPublicIP:    "node-a",
	} {
		a := FlannelAnnotations(1, mac, netip.MustParseAddr("192.168.10.11"))
		a[key] = val
		if f := ParseFlannel(a); f == nil || !strings.Contains(f.Err, key) {
			t.Errorf("%s=%s: %+v, want an error naming it", key, val, f)
		}
	}
}
