package kubeproxy

import (
	"os"
	"strings"
	"testing"
)

// TestRemoval: from a node's iptables-save (kube-proxy's iptables mode
// beside flannel, podnet's Service proxy already hooked in ahead of it),
// the restore input deletes every jump to kube-proxy's chains, flushes and
// deletes those chains table by table, and leaves kubelet's canaries,
// flannel's chains and podnet's alone.
func TestRemoval(t *testing.T) {
	save, err := os.ReadFile("testdata/kube-proxy.save")
	if err != nil {
		t.Fatal(err)
	}
	var restore []byte
	var removed []string
	for _, tr := range Removal(save) {
		restore = append(restore, tr.Restore...)
		for _, c := range tr.Chains {
			removed = append(removed, tr.Table+"/"+c)
		}
	}
	want := `*mangle
:KUBE-PROXY-CANARY - [0:0]
-X KUBE-PROXY-CANARY
COMMIT
*filter
-D INPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes load balancer firewall" -j KUBE-PROXY-FIREWALL
-D INPUT -m comment --comment "kubernetes health check service ports" -j KUBE-NODEPORTS
-D INPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes externally-visible service portals" -j KUBE-EXTERNAL-SERVICES
-D INPUT -j KUBE-FIREWALL
-D FORWARD -m conntrack --ctstate NEW -m comment --comment "kubernetes load balancer firewall" -j KUBE-PROXY-FIREWALL
-D FORWARD -m comment --comment "kubernetes forwarding rules" -j KUBE-FORWARD
-D FORWARD -m conntrack --ctstate NEW -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-D OUTPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-D OUTPUT -j KUBE-FIREWALL
:KUBE-EXTERNAL-SERVICES - [0:0]
:KUBE-FIREWALL - [0:0]
:KUBE-FORWARD - [0:0]
:KUBE-NODEPORTS - [0:0]
:KUBE-PROXY-CANARY - [0:0]
:KUBE-PROXY-FIREWALL - [0:0]
:KUBE-SERVICES - [0:0]
-X KUBE-EXTERNAL-SERVICES
-X KUBE-FIREWALL
-X KUBE-FORWARD
-X KUBE-NODEPORTS
-X KUBE-PROXY-CANARY
-X KUBE-PROXY-FIREWALL
-X KUBE-SERVICES
COMMIT
*nat
-D PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-D OUTPUT -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-D POSTROUTING -m comment --comment "kubernetes postrouting rules" -j KUBE-POSTROUTING
:KUBE-MARK-MASQ - [0:0]
:KUBE-NODEPORTS - [0:0]
:KUBE-POSTROUTING - [0:0]
:KUBE-PROXY-CANARY - [0:0]
:KUBE-SEP-IT2ZTR26TO4XFPTO - [0:0]
:KUBE-SERVICES - [0:0]
:KUBE-SVC-NPX46M4PTMTKRN6Y - [0:0]
-X KUBE-MARK-MASQ
-X KUBE-NODEPORTS
-X KUBE-POSTROUTING
-X KUBE-PROXY-CANARY
-X KUBE-SEP-IT2ZTR26TO4XFPTO
-X KUBE-SERVICES
-X KUBE-SVC-NPX46M4PTMTKRN6Y
COMMIT
`
	if string(restore) != want {
		t.Errorf("restore input:\n%s\nwant:\n%s", restore, want)
	}
	if len(removed) != 15 || removed[0] != "mangle/KUBE-PROXY-CANARY" || removed[14] != "nat/KUBE-SVC-NPX46M4PTMTKRN6Y" {
		t.Errorf("removed = %v", removed)
	}
	for _, r := range removed {
		if strings.Contains(r, "KUBELET") || strings.Contains(r, "HINT") || strings.Contains(r, "FLANNEL") || strings.Contains(r, "PODNET") {
			t.Errorf("removes %s, which is not kube-proxy's", r)
		}
	}
}

// TestRemovalNothing: a node without kube-proxy's chains gets no restore
// input at all (nothing is written).
func TestRemovalNothing(t *testing.T) {
	save := "*nat\n:PREROUTING ACCEPT [0:0]\n:KUBE-KUBELET-CANARY - [0:0]\n-A PREROUTING -j PODNET-SERVICES\nCOMMIT\n"
	if trs := Removal([]byte(save)); trs != nil {
		t.Errorf("Removal = %v; want nothing", trs)
	}
}
