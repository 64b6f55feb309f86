//go:build conformance

package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/podnet/podnet/dataplane/roottest"
	"github.com/podnet/podnet/e2e/image"
)

// agnhostPackages are the Debian packages of the agnhost stand-in.
// Upstream's image is Alpine with bind-tools, curl, netcat-openbsd,
// iproute2, iperf and bash, and busybox's applets for the rest (wget,
// nslookup, the shell's tools); here Debian's packages of the same tools,
// busybox for the applets Debian has no package of in the image, and
// conntrack and iptables, which the privileged specs exec in host-network
// pods ("which conntrack", "conntrack -L", iptables), where upstream's
// nodes have them.
var agnhostPackages = []string{"bind9-dnsutils", "curl", "netcat-openbsd", "iproute2", "iputils-ping", "procps",
	"busybox", "conntrack", "iptables"}

// agnhostApplets are linked to busybox, as its --install would: the
// applets the specs run that no package above provides.
var agnhostApplets = []string{"wget"}

// busyboxSuite is the Debian release the stand-ins with busybox's applets
// are built from: trixie's busybox is 1.37, upstream's busybox image's
// release. Bookworm's (1.35) wget dies of a segmentation fault on any -T
// (the timeout every service spec's "wget -q -O - -T 1" sets), before it
// connects: those specs failed in both labs.
const busyboxSuite = "trixie"

// agnhostSpec is the agnhost stand-in: agnhost itself, the TLS pair
// upstream's image ships for the Proxy tests, CoreDNS at /coredns (the DNS
// specs' own server pods run it from agnhost's image: "configurable pod
// resolv.conf" waited for a pod whose command was missing), and the tools.
func agnhostSpec(agnhost, coredns, crt, key string) image.Spec {
	var links []image.Link
	for _, a := range agnhostApplets {
		links = append(links, image.Link{Dst: "/usr/local/bin/" + a, Target: "/bin/busybox"})
	}
	return image.Spec{Suite: busyboxSuite, Packages: agnhostPackages,
		Files: []image.File{{Src: agnhost, Dst: "/agnhost", Mode: 0o755}, {Src: coredns, Dst: "/coredns", Mode: 0o755},
			{Src: crt, Dst: "/localhost.crt"}, {Src: key, Dst: "/localhost.key"}},
		Links: links,
		// As upstream's: with no arguments it pauses (host-exec pods).
		Entrypoint: []string{"/agnhost"}, Cmd: []string{"pause"}}
}

// execCheck is a command a spec runs in a pod and what its output holds
// when it ran, with nothing listening.
type execCheck struct{ cmd, want string }

// frameworkExecs are the commands e2e.test v1.36.3 execs in agnhost pods
// (kubectl exec … /bin/sh -x -c CMD), from test/e2e/framework and
// test/e2e/network, with their targets moved to loopback. want is what
// the output must hold: each fails to reach anything, but is there to run.
var frameworkExecs = []execCheck{
	// framework/network/utils.go: curl to netexec's /dial, /hostName; nc for UDP.
	{"curl -g -q -s 'http://127.0.0.1:9/dial?request=hostname&protocol=http&host=127.0.0.1&port=9&tries=1'; echo rc=$?", "rc=7"},
	{"curl -g -q -s -o /dev/null -w %{http_code} http://127.0.0.1:9/hostName; echo rc=$?", "rc=7"},
	{"echo hostName | nc -w 1 -u 127.0.0.1 9; echo rc=$?", "rc="},
	// framework/service/jig.go and network/util.go: reachability by nc.
	{"echo hostName | nc -v -t -w 2 127.0.0.1 9 2>&1", "refused"},
	{"echo hostName | nc -v -u -w 2 127.0.0.1 9 2>&1; echo rc=$?", "rc="},
	// framework/service/jig.go: nslookup of the Service name.
	{"nslookup -timeout=1 kubernetes.default 127.0.0.1 2>&1; echo rc=$?", "rc=1"},
	// network/service.go: wget from an exec pod (busybox's flags), as
	// verifyServeHostnameServiceUp loops it and as a one-off.
	{`wget -T 5 -qO- "http://127.0.0.1:9/" 2>&1; echo rc=$?`, "rc=1"},
	{"for i in $(seq 1 2); do wget -q -O - -T 1 http://127.0.0.1:9 2>&1 || true; echo; done; echo done", "done"},
	{"for i in $(seq 1 2); do echo; curl -q -s --connect-timeout 2 http://127.0.0.1:9/ 2>&1 || true; done; echo done", "done"},
	// network/dns_common.go: dig into a results file.
	{"dig +short +time=1 +tries=1 @127.0.0.1 kubernetes.default > /tmp/r; echo rc=$?", "rc=9"},
	// network/kube_proxy.go: the host-exec pod's conntrack checks.
	{"test -f /proc/net/nf_conntrack; which conntrack", "/usr/sbin/conntrack"},
	{"conntrack -L -f ipv4 -d 127.0.0.1 2>/dev/null | grep -m 1 'CLOSE_WAIT.*dport=9'; conntrack -L >/dev/null 2>&1; echo rc=$?", "rc=0"},
	{"iptables -t nat -S >/dev/null && ip6tables -t nat -S >/dev/null; echo rc=$?", "rc=0"},
	// network/hostport.go, dual_stack.go: curl by interface, nc over UDP.
	{"curl -g --connect-timeout 1 --interface 127.0.0.1 http://127.0.0.1:9/hostname 2>&1; echo rc=$?", "rc=7"},
	// framework/pod/output, kubectl_utils, networking.go: files and shell.
	{"touch /tmp/f && echo 'x' > /tmp/f; sync; cat /tmp/f; ls /tmp | head -1; printf ok", "ok"},
	{"timeout 2 sleep 0.1; getent hosts localhost; hostname >/dev/null; ps ax | tail -n 1 | awk '{print \"ps\"}' | sed s/ps/ok/ | tr a-z A-Z", "OK"},
	{"ip -o link show lo; ping -c 1 -W 1 127.0.0.1 >/dev/null; echo rc=$?", "rc=0"},
	// network/dns_common.go: generateCoreDNSServerPod's server, /coredns
	// -conf with the Corefile of generateCoreDNSConfigmap, asked as the
	// resolv.conf spec asks it (polled until it listens, at most 5 s).
	{`printf '. {\n\thosts {\n\t\t1.1.1.1 notexistname.resolv.conf.local\n\t}\n\tlog\n}\n' > /tmp/Corefile
/coredns -conf /tmp/Corefile >/tmp/coredns.log 2>&1 &
for i in $(seq 1 50); do dig +short +time=1 +tries=1 @127.0.0.1 notexistname.resolv.conf.local 2>/dev/null | grep -q . && break; sleep 0.1; done
dig +short +time=1 +tries=1 @127.0.0.1 notexistname.resolv.conf.local; kill $!`, "1.1.1.1"},
}

// standIn is an image the lab builds in place of upstream's, under the tag
// e2e.test asks for, and the commands the specs run in it.
type standIn struct {
	tag   string
	spec  image.Spec
	execs []execCheck
}

// standIns are the images whose tools the [sig-network] specs run: agnhost
// (frameworkExecs); busybox, in which the conntrack specs run a shell that
// sleeps (an init container) or loops over busybox's nc; distroless-iptables,
// the host-network pod whose conntrack table kube_proxy.go reads (sh, test,
// cat, grep, which, conntrack, sleep, as upstream's Debian-based image has);
// and regression-issue-74839, the conntrack spec's boom-server, built from
// e2e.test's own release on Debian as upstream's is. Binaries are passed
// in: agnhost, CoreDNS and the boom-server.
func standIns(agnhost, coredns, crt, key, regression string) []standIn {
	busybox := image.Spec{Suite: busyboxSuite, Packages: []string{"busybox"},
		Entrypoint: []string{"/bin/sh"}}
	for _, a := range []string{"nc", "wget", "nslookup"} {
		busybox.Links = append(busybox.Links, image.Link{Dst: "/usr/local/bin/" + a, Target: "/bin/busybox"})
	}
	return []standIn{
		{confRegistry + "/agnhost:2.63.0", agnhostSpec(agnhost, coredns, crt, key), frameworkExecs},
		{confRegistry + "/busybox:1.37.0-1", busybox, []execCheck{
			{"echo Pausing start. && sleep 0", "Pausing start."},
			{"nc 127.0.0.1 9000 </dev/null 2>&1; echo rc=$?", "rc=1"},
			{"wget -T 1 -qO- http://127.0.0.1:9/ 2>&1; echo rc=$?", "rc=1"},
			{"nc --help 2>&1 | head -1", "BusyBox"},
		}},
		{confBuildRegistry + "/distroless-iptables:v0.9.6", image.Spec{Suite: "bookworm", Packages: []string{"conntrack", "iptables"}}, []execCheck{
			{"sleep 0; test -f /proc/net/nf_conntrack; which conntrack", "/usr/sbin/conntrack"},
			{"cat /proc/net/nf_conntrack 2>/dev/null | grep -m 1 -E 'CLOSE_WAIT.*dst=127.0.0.1.*dport=9'; echo rc=$?", "rc=1"},
			{"conntrack -L -f ipv4 -d 127.0.0.1 2>/dev/null | grep -m 1 'CLOSE_WAIT.*dport=9'; conntrack -L >/dev/null 2>&1; echo rc=$?", "rc=0"},
			{"iptables-save >/dev/null && ip6tables-save >/dev/null; echo rc=$?", "rc=0"},
		}},
		{confRegistry + "/regression-issue-74839:1.4", image.Spec{Suite: "bookworm",
			Files:      []image.File{{Src: regression, Dst: "/regression-issue-74839", Mode: 0o755}},
			Entrypoint: []string{"/regression-issue-74839"}}, []execCheck{
			// Serves until killed (it exits at once on a missing tool or
			// address).
			{"POD_IP=127.0.0.1 timeout 2 /regression-issue-74839 >/dev/null 2>&1; echo rc=$?", "rc=124"},
		}},
	}
}

// TestAgnhostStandInRunsTheFrameworksCommands builds each stand-in of
// standIns (agnhost, busybox, distroless-iptables, regression-issue-74839)
// and runs, in its root filesystem (chroot, in namespaces of its own: a
// network with only loopback, its own /proc), every command the specs run
// in it: none may be missing ("not found", exit 127), and each must answer
// as the tool does when nothing listens.
func TestAgnhostStandInRunsTheFrameworksCommands(t *testing.T) {
	roottest.Require(t)
	roottest.Tool(t, "mmdebstrap", "mmdebstrap")
	coredns := os.Getenv("PODNET_COREDNS")
	if coredns == "" {
		t.Fatal("$PODNET_COREDNS is unset: run make conformance")
	}
	dir := t.TempDir()
	stub := filepath.Join(dir, "stub")
	if err := os.WriteFile(stub, []byte("stand-in"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, si := range standIns(stub, coredns, stub, stub, buildRegression74839(t, dir)) {
		name := si.tag[strings.LastIndex(si.tag, "/")+1:]
		t.Run(name, func(t *testing.T) {
			out := filepath.Join(dir, strings.NewReplacer("/", "_", ":", "_").Replace(si.tag)+".tar")
			if err := image.Build(t.Context(), image.BuildOptions{Spec: si.spec, Tag: si.tag, Out: out, CacheDir: "/var/cache/podnet"}); err != nil {
				t.Fatal(err)
			}
			root := extractImage(t, out, si.tag, filepath.Join(dir, "root-"+name))
			runExecChecks(t, root, si.execs)
		})
	}
}

// runExecChecks runs checks in the root filesystem root, each in a shell
// of its own as kubectl exec runs it, and fails t for each missing command
// or output without its want.
func runExecChecks(t *testing.T, root string, checks []execCheck) {
	t.Helper()
	var script strings.Builder
	script.WriteString("mount -t proc proc /proc || exit 3\n")
	for i, e := range checks {
		fmt.Fprintf(&script, "echo '=== %d'; /bin/sh -c %s 2>&1; echo \"=== exit $?\"\n", i, shellQuote(e.cmd))
	}
	// Loopback comes up by the build machine's ip, in the new network
	// namespace: not every image has one.
	cmd := exec.CommandContext(t.Context(), "unshare", "--net", "--mount", "--pid", "--fork", "--uts",
		"/bin/sh", "-c", `ip link set lo up && exec chroot "$1" /bin/sh -c "$2"`, "sh", root, script.String())
	cmd.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
	b, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("run in the image: %v\n%s", err, b)
	}
	// Each command's block: "=== I", its output, "=== exit CODE".
	outputs := map[int]string{}
	cur := -1
	for _, line := range strings.Split(string(b), "\n") {
		if _, err := fmt.Sscanf(line, "=== %d", &cur); err == nil && !strings.HasPrefix(line, "=== exit") {
			continue
		}
		if cur >= 0 {
			outputs[cur] += line + "\n"
		}
	}
	for i, e := range checks {
		got := outputs[i]
		switch {
		case strings.Contains(got, "not found") || strings.Contains(got, "=== exit 127"):
			t.Errorf("%q: a command is missing:\n%s", e.cmd, got)
		case killedBySignal.MatchString(got):
			t.Errorf("%q: a command died of a signal:\n%s", e.cmd, got)
		case !hasWant(got, e.want):
			t.Errorf("%q: output lacks %q:\n%s", e.cmd, e.want, got)
		}
	}
	if t.Failed() {
		t.Logf("all output:\n%s", b)
	}
}

// killedBySignal is what the shell says of a command a signal ended (dash
// names the signal; an exit status over 128 is the rest): a tool that
// crashes on the specs' flags is as useless to them as a missing one.
var killedBySignal = regexp.MustCompile(`(?m)Segmentation fault|Aborted|Illegal instruction|Bus error|core dumped|(rc=|=== exit )(129|1[3-5][0-9])$`)

// hasWant says whether a command's output holds want: an exit status
// ("rc=N") not followed by another digit, so that rc=1 is not found in
// rc=139; anything else anywhere.
func hasWant(out, want string) bool {
	if strings.HasPrefix(want, "rc=") && want != "rc=" {
		return regexp.MustCompile(regexp.QuoteMeta(want) + `(\D|$)`).MatchString(out)
	}
	return strings.Contains(out, want)
}

// extractImage unpacks the image at path into dir (its root filesystem,
// every layer applied) and returns dir.
func extractImage(t *testing.T, path, tag, dir string) string {
	t.Helper()
	ref, err := name.NewTag(tag)
	if err != nil {
		t.Fatal(err)
	}
	img, err := tarball.ImageFromPath(path, &ref)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	rc := mutate.Extract(img)
	defer rc.Close()
	cmd := exec.Command("tar", "-x", "-C", dir)
	cmd.Stdin = rc
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("unpack %s: %v\n%s", path, err, b)
	}
	return dir
}

// shellQuote quotes s for /bin/sh.
func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }
