// Package apiserver runs a real kube-apiserver and etcd for the end-to-end
// tests, inside a network namespace of the test's own.
//
// kube-apiserver is built from the Go module proxy by the tools module in
// ./tools (make apiserver) and found through $PODNET_KUBE_APISERVER; etcd is
// Debian's etcd-server. Nothing else of a control plane runs: no scheduler,
// no controller manager, so objects stay exactly as the test writes them.
//
// Clients authenticate with static bearer tokens: an admin in
// system:masters, and one identity per podnet service account so that the
// RBAC rules of deploy/base/podnet.yaml are what a daemon's requests are checked
// against.
package apiserver

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// EnvBinary names the kube-apiserver binary; the Makefile sets it.
const EnvBinary = "PODNET_KUBE_APISERVER"

// EtcdBinary is Debian etcd-server's etcd.
const EtcdBinary = "/usr/bin/etcd"

// Port is the API server's secure port.
const Port = 6443

// ServiceCIDR is the cluster's Service range; kubernetes = 10.96.0.1.
const ServiceCIDR = "10.96.0.0/12"

// Identities with a token each. The service accounts are the ones
// deploy/base/podnet.yaml binds its ClusterRoles to.
const (
	Admin   = "admin"
	NodeSA  = "system:serviceaccount:podnet-system:podnet-node"
	DNSSA   = "system:serviceaccount:kube-system:podnet-dns"
	groupSA = "system:serviceaccounts"
)

// Process is a background process in the namespace: what lab.Proc offers.
type Process interface {
	Stop() error
	Kill()
	Done() <-chan struct{}
	Output() string
}

// Options say where the control plane runs.
type Options struct {
	// NSPath is the network namespace etcd and kube-apiserver run in and
	// clients of this process dial from.
	NSPath string
	// Start starts a process in that namespace.
	Start func(name string, args ...string) (Process, error)
	// Dir holds certificates, keys, tokens and kubeconfigs. etcd's data
	// lives under EtcdDir (default: Dir/etcd).
	Dir     string
	EtcdDir string
	// AdvertiseAddress is the address the kubernetes Service points at;
	// 127.0.0.1 when unset.
	AdvertiseAddress netip.Addr
	// Binary is kube-apiserver; default $PODNET_KUBE_APISERVER.
	Binary string
	// Users are more identities with a token each, mapped to their group
	// (a kubelet: system:node:NAME in system:nodes).
	Users map[string]string
	// AuthorizationMode is kube-apiserver's --authorization-mode; RBAC when
	// empty.
	AuthorizationMode string
	// ExtraArgs are appended to kube-apiserver's arguments.
	ExtraArgs []string
}

// Server is a running etcd + kube-apiserver.
type Server struct {
	o      Options
	tokens map[string]string

	mu        sync.Mutex
	etcd      Process
	apiserver Process
}

// Binary returns the kube-apiserver to run, or an error that says how to
// build it.
func Binary() (string, error) {
	p := os.Getenv(EnvBinary)
	if p == "" {
		return "", fmt.Errorf("$%s is not set: run the tests with `make test`, which builds kube-apiserver (make apiserver) and sets it", EnvBinary)
	}
	if _, err := os.Stat(p); err != nil {
		return "", fmt.Errorf("$%s: %w (make apiserver builds it)", EnvBinary, err)
	}
	if _, err := os.Stat(EtcdBinary); err != nil {
		return "", fmt.Errorf("etcd: %w (scripts/deps.sh installs etcd-server)", err)
	}
	return p, nil
}

// Start runs etcd and kube-apiserver and waits until the API server is
// ready. On error, what was started is stopped again.
func Start(ctx context.Context, o Options) (*Server, error) {
	if o.Binary == "" {
		b, err := Binary()
		if err != nil {
			return nil, err
		}
		o.Binary = b
	}
	if o.EtcdDir == "" {
		o.EtcdDir = filepath.Join(o.Dir, "etcd")
	}
	if !o.AdvertiseAddress.IsValid() {
		o.AdvertiseAddress = netip.MustParseAddr("127.0.0.1")
	}
	s := &Server{o: o, tokens: map[string]string{}}
	if err := s.writeFiles(); err != nil {
		return nil, err
	}
	if err := s.StartEtcd(); err != nil {
		return nil, err
	}
	if err := s.StartAPIServer(ctx); err != nil {
		return nil, errors.Join(err, s.Close())
	}
	return s, nil
}

func (s *Server) path(name string) string { return filepath.Join(s.o.Dir, name) }

// writeFiles writes the service-account signing key and the token file.
func (s *Server) writeFiles() error {
	if err := os.MkdirAll(s.o.Dir, 0o700); err != nil {
		return fmt.Errorf("create %s: %w", s.o.Dir, err)
	}
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return fmt.Errorf("generate service account key: %w", err)
	}
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return err
	}
	if err := os.WriteFile(s.path("sa.key"), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), 0o600); err != nil {
		return fmt.Errorf("write service account key: %w", err)
	}
	var lines []string
	users := []string{Admin, NodeSA, DNSSA}
	for u := range s.o.Users {
		users = append(users, u)
	}
	for i, user := range users {
		b := make([]byte, 16)
		if _, err := rand.Read(b); err != nil {
			return err
		}
		tok := hex.EncodeToString(b)
		s.tokens[user] = tok
		group := groupSA
		if user == Admin {
			group = "system:masters"
		} else if g, ok := s.o.Users[user]; ok {
			group = g
		}
		// token,user,uid,"group1,group2"
		lines = append(lines, fmt.Sprintf("%s,%s,uid-%d,\"%s\"", tok, user, i, group))
	}
	if err := os.WriteFile(s.path("tokens.csv"), []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
		return fmt.Errorf("write token file: %w", err)
	}
	return nil
}

// StartAPIServer (re)starts kube-apiserver against the running etcd and
// waits until it is ready.
func (s *Server) StartAPIServer(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.apiserver != nil {
		return errors.New("kube-apiserver already runs")
	}
	p, err := s.o.Start("kube-apiserver", s.apiserverArgs(Port)...)
	if err != nil {
		return err
	}
	s.apiserver = p
	if err := s.waitReady(ctx, p, Port); err != nil {
		s.apiserver = nil
		p.Kill()
		return err
	}
	return nil
}

func (s *Server) apiserverArgs(port int, extra ...string) []string {
	authz := s.o.AuthorizationMode
	if authz == "" {
		authz = "RBAC"
	}
	args := []string{s.o.Binary,
		"--etcd-servers=http://127.0.0.1:2379",
		"--bind-address=0.0.0.0",
		fmt.Sprintf("--secure-port=%d", port),
		"--advertise-address=" + s.o.AdvertiseAddress.String(),
		"--cert-dir=" + s.path("certs"),
		"--token-auth-file=" + s.path("tokens.csv"),
		"--authorization-mode=" + authz,
		"--service-cluster-ip-range=" + ServiceCIDR,
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file=" + s.path("sa.key"),
		"--service-account-signing-key-file=" + s.path("sa.key"),
		"--allow-privileged=true",
		// One machine, a handful of clients: fairness queues only cost.
		"--enable-priority-and-fairness=false",
		"--profiling=false",
		"--v=0",
	}
	return append(append(args, s.o.ExtraArgs...), extra...)
}

// StartSecond runs a second kube-apiserver on port, against the same etcd,
// and waits until it is ready: another control-plane replica, which clients
// of the first do not know. It takes no part in the kubernetes Service's
// endpoints. The returned func stops it.
func (s *Server) StartSecond(ctx context.Context, port int) (kubernetes.Interface, func(), error) {
	p, err := s.o.Start(fmt.Sprintf("kube-apiserver-%d", port), s.apiserverArgs(port, "--endpoint-reconciler-type=none")...)
	if err != nil {
		return nil, nil, err
	}
	if err := s.waitReady(ctx, p, port); err != nil {
		p.Kill()
		return nil, nil, err
	}
	c, err := kubernetes.NewForConfig(s.restConfig(Admin, port))
	if err != nil {
		p.Kill()
		return nil, nil, err
	}
	return c, p.Kill, nil
}

// StopEtcd kills etcd under the running kube-apiserver; StartEtcd starts
// it again on the same data.
func (s *Server) StopEtcd() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.etcd != nil {
		s.etcd.Kill()
		s.etcd = nil
	}
}

// StartEtcd starts etcd on its data directory.
func (s *Server) StartEtcd() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.etcd != nil {
		return errors.New("etcd already runs")
	}
	etcd, err := s.o.Start("etcd", EtcdBinary,
		"--name=default",
		"--data-dir="+s.o.EtcdDir,
		"--listen-client-urls=http://127.0.0.1:2379",
		"--advertise-client-urls=http://127.0.0.1:2379",
		"--listen-peer-urls=http://127.0.0.1:2380",
		"--initial-advertise-peer-urls=http://127.0.0.1:2380",
		"--initial-cluster=default=http://127.0.0.1:2380",
		"--log-level=warn",
	)
	if err != nil {
		return err
	}
	s.etcd = etcd
	return nil
}

// StopAPIServer kills kube-apiserver (etcd keeps running): an outage as
// clients see a crash. Its graceful shutdown would wait for every watch to
// end.
func (s *Server) StopAPIServer() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.apiserver == nil {
		return nil
	}
	s.apiserver.Kill()
	s.apiserver = nil
	return nil
}

func (s *Server) waitReady(ctx context.Context, p Process, port int) error {
	client, err := kubernetes.NewForConfig(s.restConfig(Admin, port))
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	var last error
	for {
		body, err := client.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		if err == nil && strings.TrimSpace(string(body)) == "ok" {
			return nil
		}
		last = err
		select {
		case <-p.Done():
			return fmt.Errorf("kube-apiserver exited: %s", tail(p.Output()))
		case <-ctx.Done():
			return fmt.Errorf("kube-apiserver not ready: %v (last: %v)\n%s", ctx.Err(), last, tail(p.Output()))
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// Close stops kube-apiserver and etcd.
func (s *Server) Close() error {
	errs := []error{s.StopAPIServer()}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.etcd != nil {
		errs = append(errs, s.etcd.Stop())
		s.etcd = nil
	}
	return errors.Join(errs...)
}

// Logs returns the tail of what etcd and kube-apiserver printed.
func (s *Server) Logs() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var b strings.Builder
	if s.etcd != nil {
		fmt.Fprintf(&b, "=== etcd\n%s\n", tail(s.etcd.Output()))
	}
	if s.apiserver != nil {
		fmt.Fprintf(&b, "=== kube-apiserver\n%s\n", tail(s.apiserver.Output()))
	}
	return b.String()
}

func tail(s string) string {
	const n = 8 << 10
	if len(s) <= n {
		return s
	}
	return "…" + s[len(s)-n:]
}

// RestConfig is a client config for user whose connections are opened
// inside the control plane's namespace: a socket stays in the namespace it
// was created in, so this process needs no route to the API server.
func (s *Server) RestConfig(user string) *rest.Config { return s.restConfig(user, Port) }

func (s *Server) restConfig(user string, port int) *rest.Config {
	return &rest.Config{
		Host:            fmt.Sprintf("https://127.0.0.1:%d", port),
		BearerToken:     s.tokens[user],
		TLSClientConfig: rest.TLSClientConfig{Insecure: true},
		Dial:            dialIn(s.o.NSPath),
		QPS:             -1, // no client-side rate limit: tests create objects in bulk
		Timeout:         30 * time.Second,
	}
}

// Client is a clientset for user (see RestConfig).
func (s *Server) Client(user string) (kubernetes.Interface, error) {
	return kubernetes.NewForConfig(s.RestConfig(user))
}

// WriteKubeconfig writes a kubeconfig for user that reaches the API server
// at addr (from a namespace with a route to it) to path.
func (s *Server) WriteKubeconfig(path, user string, addr netip.Addr) error {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["lab"] = &clientcmdapi.Cluster{
		Server:                fmt.Sprintf("https://%s", netip.AddrPortFrom(addr, Port)),
		InsecureSkipTLSVerify: true,
	}
	cfg.AuthInfos[user] = &clientcmdapi.AuthInfo{Token: s.tokens[user]}
	cfg.Contexts["lab"] = &clientcmdapi.Context{Cluster: "lab", AuthInfo: user}
	cfg.CurrentContext = "lab"
	return clientcmd.WriteToFile(*cfg, path)
}

// dialIn dials from inside the namespace at nsPath.
func dialIn(nsPath string) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		netns, err := ns.GetNS(nsPath)
		if err != nil {
			return nil, err
		}
		defer netns.Close()
		var conn net.Conn
		err = netns.Do(func(ns.NetNS) error {
			var d net.Dialer
			c, err := d.DialContext(ctx, network, addr)
			conn = c
			return err
		})
		return conn, err
	}
}

// CertFile is the API server's self-signed serving certificate: the root CA
// kube-controller-manager publishes to pods (kube-root-ca.crt).
func (s *Server) CertFile() string { return s.path("certs/apiserver.crt") }

// SAKeyFile is the service-account signing key, which
// kube-controller-manager needs too.
func (s *Server) SAKeyFile() string { return s.path("sa.key") }
