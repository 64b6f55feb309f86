# podnet: `make demo` runs the lab, `make test` runs every test. Both install
# what they need first (Debian packages via scripts/deps.sh, Go modules via go).

GO       ?= go
# The release this tree builds: the image tag `make image` writes and the
# one deploy/ installs (deploy/base/kustomization.yaml and
# deploy/base/podnet.yaml name it; e2e/deploy_test.go fails when they disagree).
RELEASE  := v0.1.0
VERSION  ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS  := -s -w -X github.com/podnet/podnet/dataplane/version.Version=$(VERSION)
GOFLAGS_BUILD := -trimpath -ldflags '$(LDFLAGS)'
export CGO_ENABLED ?= 0

# How long make test fuzzes dnsd's query path (seed corpus always runs).
FUZZTIME ?= 20s

BINARIES := bin/podnet bin/loopback bin/portmap bin/proxyd bin/dnsd bin/podnet-lab

.PHONY: all build deps test demo demo-down bench bench-table soak lint generate clean apiserver image kube-node nft conformance conformance-modes conformance-dualstack conformance-policy flannel migrate dns-lab

all: build

build: $(BINARIES)

bin/podnet: FORCE
	$(GO) build $(GOFLAGS_BUILD) -o $@ ./cmd/cni-plugin
# The CNI reference loopback plugin: container runtimes run it for every pod
# sandbox, and `podnet install` installs it beside podnet when a node has none.
# It is a tool in go.mod, so `go mod tidy` keeps what it needs in go.sum.
bin/loopback: FORCE
	$(GO) build $(GOFLAGS_BUILD) -o $@ github.com/containernetworking/plugins/plugins/main/loopback
# The CNI reference portmap plugin, chained after podnet for hostPorts.
bin/portmap: FORCE
	$(GO) build $(GOFLAGS_BUILD) -o $@ github.com/containernetworking/plugins/plugins/meta/portmap
bin/proxyd: FORCE
	$(GO) build $(GOFLAGS_BUILD) -o $@ ./cmd/proxyd
bin/dnsd: FORCE
	$(GO) build $(GOFLAGS_BUILD) -o $@ ./cmd/dnsd
bin/podnet-lab: FORCE
	$(GO) build $(GOFLAGS_BUILD) -o $@ ./e2e/cmd/podnet-lab
FORCE:

deps:
	@bash scripts/deps.sh

# A real kube-apiserver for the e2e tests, built from the Go module proxy by
# the tools module in e2e/apiserver/tools (its version is the one that module
# requires) and cached outside the tree, with what a real node of the lab
# runs (e2e/realnode): kubelet, and for its cluster kube-controller-manager,
# kube-scheduler and kubectl. All five come from ONE go build, so the
# packages they share compile once and their links overlap other compiles
# (a fresh machine builds them all for make test). The version ldflags make
# them report $(APISERVER_VERSION) instead of v0.0.0-master.
APISERVER_VERSION := v1.36.3
APISERVER_CACHE ?= /var/cache/podnet
APISERVER := $(APISERVER_CACHE)/kube-apiserver-$(APISERVER_VERSION)

apiserver: $(APISERVER)

KUBE_NODE_BINS := kubelet kube-controller-manager kube-scheduler kubectl
KUBE_NODE := $(foreach b,$(KUBE_NODE_BINS),$(APISERVER_CACHE)/$(b)-$(APISERVER_VERSION))
KUBE_VERSION_LDFLAGS := $(foreach p,k8s.io/component-base/version k8s.io/client-go/pkg/version,-X $(p).gitVersion=$(APISERVER_VERSION) -X $(p).gitMajor=1 -X $(p).gitMinor=36 -X $(p).gitTreeState=clean)
KUBE_BUILD_BINS := kube-apiserver $(KUBE_NODE_BINS)
# containerd and runc from Debian's packages, unpacked without running their
# install scripts (no daemon starts, nothing outside the cache changes).
CONTAINERD_ROOT := $(APISERVER_CACHE)/containerd-debian

kube-node: $(KUBE_NODE) $(CONTAINERD_ROOT)/usr/bin/containerd
$(APISERVER) $(KUBE_NODE) &:
	mkdir -p $(APISERVER_CACHE)
	rm -rf $(APISERVER_CACHE)/kube-build.tmp
	cd e2e/apiserver/tools && nice -n 10 $(GO) build -trimpath \
		-ldflags '-s -w $(KUBE_VERSION_LDFLAGS)' -o $(APISERVER_CACHE)/kube-build.tmp/ \
		$(foreach b,$(KUBE_BUILD_BINS),k8s.io/kubernetes/cmd/$(b))
	for b in $(KUBE_BUILD_BINS); do mv $(APISERVER_CACHE)/kube-build.tmp/$$b $(APISERVER_CACHE)/$$b-$(APISERVER_VERSION); done
	rmdir $(APISERVER_CACHE)/kube-build.tmp
# nft of Debian's nftables, unpacked the same way, for kube-proxy's
# nftables mode in make bench (it execs nft; proxyd does not).
NFT_ROOT := $(APISERVER_CACHE)/nftables-debian
nft: $(NFT_ROOT)/usr/sbin/nft
$(NFT_ROOT)/usr/sbin/nft:
	rm -rf $(NFT_ROOT).tmp && mkdir -p $(NFT_ROOT).tmp/debs
	cd $(NFT_ROOT).tmp/debs && { apt-get download nftables libnftables1 libnftnl11 || { apt-get update -q && apt-get download nftables libnftables1 libnftnl11; }; }
	for d in $(NFT_ROOT).tmp/debs/*.deb; do dpkg-deb -x $$d $(NFT_ROOT).tmp; done
	rm -rf $(NFT_ROOT) && mv $(NFT_ROOT).tmp $(NFT_ROOT)
$(CONTAINERD_ROOT)/usr/bin/containerd:
	rm -rf $(CONTAINERD_ROOT).tmp && mkdir -p $(CONTAINERD_ROOT).tmp/debs
	cd $(CONTAINERD_ROOT).tmp/debs && { apt-get download containerd runc || { apt-get update -q && apt-get download containerd runc; }; }
	for d in $(CONTAINERD_ROOT).tmp/debs/*.deb; do dpkg-deb -x $$d $(CONTAINERD_ROOT).tmp; done
	rm -rf $(CONTAINERD_ROOT) && mv $(CONTAINERD_ROOT).tmp $(CONTAINERD_ROOT)

# The images the conformance specs run, each with the commands they exec in
# it (TestAgnhostStandInRunsTheFrameworksCommands), then three real nodes
# running podnet (two on one segment, one across the router): TestRealNodes
# (zones and host names of the nodes, pod to pod over host-gw and VXLAN,
# ClusterIP, NodePort, kubectl exec and logs, a DaemonSet rolling update under traffic,
# kubelet and containerd killed and restarted with a pod's containers lost;
# TestRealNodesEBPF the same with deploy/ebpf, TestRealNodesNFT with
# deploy/nftables (no podnet rule in any node's iptables); TestRealNodeHelm: one node
# installed from the Helm chart, deploy/helm/podnet, in nftables mode),
# then the Kubernetes network conformance tests (e2e/conformance_test.go)
# against such a lab and, at the same time, against the baseline lab
# (kube-proxy and CoreDNS in place of proxyd's Service proxy and dnsd):
# e2e.test and agnhost of the same release, from the same tools module (go
# test -c as upstream builds it, with its build tags; -vet=off, or go vet
# alone takes many minutes). CONFORMANCE_BUDGET and CONFORMANCE_TIMEOUT
# below bound a run; README's conformance section has measured durations.
E2E_TEST := $(APISERVER_CACHE)/e2e.test-$(APISERVER_VERSION)
AGNHOST := $(APISERVER_CACHE)/agnhost-$(APISERVER_VERSION)
$(E2E_TEST) $(AGNHOST) &:
	mkdir -p $(APISERVER_CACHE)
	cd e2e/apiserver/tools && nice -n 10 $(GO) test -c -vet=off -trimpath -tags selinux,notest,grpcnotrace \
		-ldflags '-s -w $(KUBE_VERSION_LDFLAGS)' -o $(E2E_TEST).tmp k8s.io/kubernetes/test/e2e
	cd e2e/apiserver/tools && nice -n 10 $(GO) build -trimpath -ldflags '-s -w' -o $(AGNHOST).tmp k8s.io/kubernetes/test/images/agnhost
	mv $(E2E_TEST).tmp $(E2E_TEST)
	mv $(AGNHOST).tmp $(AGNHOST)

# The baseline the conformance run is compared with, in the same run:
# kube-proxy of the same release (iptables mode) and CoreDNS at the version
# that release's kubeadm installs (cmd/kubeadm/app/constants), both from the
# Go module proxy and cached beside the other kube binaries. CoreDNS is
# built by go install from its own module (its go.sum, no replace), not
# from the tools module, whose Kubernetes libraries it must not move.
KUBE_PROXY := $(APISERVER_CACHE)/kube-proxy-$(APISERVER_VERSION)
COREDNS_VERSION := v1.14.2
COREDNS := $(APISERVER_CACHE)/coredns-$(COREDNS_VERSION)
$(KUBE_PROXY):
	mkdir -p $(APISERVER_CACHE)
	cd e2e/apiserver/tools && nice -n 10 $(GO) build -trimpath \
		-ldflags '-s -w $(KUBE_VERSION_LDFLAGS)' -o $@.tmp k8s.io/kubernetes/cmd/kube-proxy
	mv $@.tmp $@
$(COREDNS):
	rm -rf $@.tmp && mkdir -p $@.tmp
	GOBIN=$@.tmp nice -n 10 $(GO) install -trimpath -ldflags '-s -w' github.com/coredns/coredns@$(COREDNS_VERSION)
	mv $@.tmp/coredns $@
	rmdir $@.tmp

# The NetworkPolicy baseline (CONFORMANCE_LABS=kube-network-policies):
# sig-network's kube-network-policies, built by go install from its own
# module (its go.sum, no replace) and cached like CoreDNS. Its main package
# at v0.8.0 is the module's cmd/ (go install names the binary cmd). It
# queues new connections to userspace with nftables' queue expression, so
# it needs a kernel with nft_queue (CONFIG_NFT_QUEUE); the lab checks.
KUBE_NETWORK_POLICIES_VERSION := v0.8.0
KUBE_NETWORK_POLICIES := $(APISERVER_CACHE)/kube-network-policies-$(KUBE_NETWORK_POLICIES_VERSION)
$(KUBE_NETWORK_POLICIES):
	rm -rf $@.tmp && mkdir -p $@.tmp
	GOBIN=$@.tmp nice -n 10 $(GO) install -trimpath -ldflags '-s -w' sigs.k8s.io/kube-network-policies/cmd@$(KUBE_NETWORK_POLICIES_VERSION)
	mv $@.tmp/cmd $@
	rmdir $@.tmp

# The starting point of make migrate: flannel, the release line the
# issue's clusters run, built from its Go module (the Go module proxy) and
# cached like the kube binaries. Its main package imports every backend,
# and the proxy does not serve the Tencent Cloud SDK module its tencentvpc
# backend needs, and the udp backend needs cgo (this Makefile builds static
# binaries, which the lab's images need), so the build is of a copy of the
# module with those two import lines left out (the lab uses the vxlan
# backend). Its CNI side is
# the reference bridge and host-local plugins (tools in go.mod), with the
# configuration flannel's CNI plugin would hand them.
FLANNEL_VERSION := v0.28.10
FLANNELD := $(APISERVER_CACHE)/flanneld-$(FLANNEL_VERSION)
$(FLANNELD):
	mkdir -p $(APISERVER_CACHE)
	rm -rf $@.src $@.tmp
	cp -r "$$(cd $(APISERVER_CACHE) && $(GO) mod download -json github.com/flannel-io/flannel@$(FLANNEL_VERSION) | sed -n 's/^\t"Dir": "\(.*\)",$$/\1/p')" $@.src
	chmod -R u+w $@.src
	sed -i -e '\#"github.com/flannel-io/flannel/pkg/backend/tencentvpc"#d' -e '\#"github.com/flannel-io/flannel/pkg/backend/udp"#d' $@.src/main.go
	cd $@.src && nice -n 10 $(GO) build -trimpath \
		-ldflags '-s -w -X github.com/flannel-io/flannel/pkg/version.Version=$(FLANNEL_VERSION)' -o $@.tmp .
	mv $@.tmp $@
	rm -rf $@.src
bin/bridge: FORCE
	$(GO) build $(GOFLAGS_BUILD) -o $@ github.com/containernetworking/plugins/plugins/main/bridge
bin/host-local: FORCE
	$(GO) build $(GOFLAGS_BUILD) -o $@ github.com/containernetworking/plugins/plugins/ipam/host-local
flannel: $(FLANNELD) bin/bridge bin/host-local

# The ginkgo CLI runs e2e.test with parallel processes, as upstream CI
# does: at the version e2e.test is built with (the tools module's), from the
# Go module proxy by go install (its own go.sum), cached like the rest.
GINKGO_VERSION := $(shell awk '$$1 == "github.com/onsi/ginkgo/v2" { print $$2 }' e2e/apiserver/tools/go.mod)
GINKGO := $(APISERVER_CACHE)/ginkgo-$(GINKGO_VERSION)
$(GINKGO):
	rm -rf $@.tmp && mkdir -p $@.tmp
	GOBIN=$@.tmp nice -n 10 $(GO) install -trimpath -ldflags '-s -w' github.com/onsi/ginkgo/v2/ginkgo@$(GINKGO_VERSION)
	mv $@.tmp/ginkgo $@
	rmdir $@.tmp

# What TestConformance runs: the specs of CONFORMANCE_FOCUS but
# CONFORMANCE_SKIP's, on the labs of CONFORMANCE_LABS (kinds in
# e2e/conformance_test.go's confLabs: podnet, podnet-ebpf, podnet-nftables,
# baseline, kube-network-policies), over CONFORMANCE_PROCS ginkgo processes, each lab's
# e2e.test at most CONFORMANCE_BUDGET (empty: until go test's timeout).
# [Serial] specs, when the skip lets them in, run after the others, one at
# a time (ginkgo's Serial decorator). CONFORMANCE_ONE_LAB=1 runs the podnet
# lab and the baseline one after the other instead of at once, for a box
# too small for both; give CONFORMANCE_TIMEOUT room for two budgets then.
# A larger focus, e.g.:
#   make conformance CONFORMANCE_FOCUS='\[sig-network\] (Services|Conntrack|DNS|Networking|EndpointSlice)' \
#     CONFORMANCE_ONE_LAB=1 CONFORMANCE_BUDGET=50m CONFORMANCE_TIMEOUT=150m
CONFORMANCE_FOCUS ?= \[sig-network\].*\[Conformance\]
CONFORMANCE_SKIP ?= \[Serial\]|\[Disruptive\]
CONFORMANCE_LABS ?= podnet baseline
CONFORMANCE_PROCS ?= 4
CONFORMANCE_BUDGET ?=
CONFORMANCE_ONE_LAB ?=
CONFORMANCE_TIMEOUT ?= 45m
# The go tests make conformance runs: the real-node ones, then TestConformance.
CONFORMANCE_TESTS ?= TestAgnhostStandInRunsTheFrameworksCommands|TestNFTQueueProbe|TestRealNodes|TestRealNodesEBPF|TestRealNodesNFT|TestRealNodesDualStack|TestRealNodeHelm|TestConformance
conformance: deps build apiserver image kube-node $(E2E_TEST) $(AGNHOST) $(KUBE_PROXY) $(COREDNS) $(KUBE_NETWORK_POLICIES) $(GINKGO)
	PODNET_BIN=$(CURDIR)/bin PODNET_KUBE_APISERVER=$(APISERVER) PODNET_IMAGE=$(CURDIR)/$(IMAGE) \
	PODNET_E2E_TEST=$(E2E_TEST) PODNET_AGNHOST=$(AGNHOST) PODNET_GINKGO=$(GINKGO) \
	PODNET_CONFORMANCE_FOCUS='$(CONFORMANCE_FOCUS)' PODNET_CONFORMANCE_SKIP='$(CONFORMANCE_SKIP)' \
	PODNET_CONFORMANCE_PROCS=$(CONFORMANCE_PROCS) PODNET_CONFORMANCE_BUDGET=$(CONFORMANCE_BUDGET) \
	PODNET_CONFORMANCE_ONE_LAB=$(CONFORMANCE_ONE_LAB) PODNET_CONFORMANCE_LABS='$(CONFORMANCE_LABS)' \
	PODNET_KUBE_PROXY=$(KUBE_PROXY) PODNET_COREDNS=$(COREDNS) PODNET_KUBE_NETWORK_POLICIES=$(KUBE_NETWORK_POLICIES) \
		$(GO) test -tags conformance -count=1 -timeout $(CONFORMANCE_TIMEOUT) -v -run '^($(CONFORMANCE_TESTS))$$' ./e2e/

# make conformance's [Conformance] specs on podnet's other two proxy modes,
# deploy/ebpf and deploy/nftables, side by side (the iptables mode and the
# baseline are make conformance's own labs): make conformance split in
# parts that each stay under an hour.
conformance-modes:
	$(MAKE) conformance CONFORMANCE_LABS='podnet-ebpf podnet-nftables' \
		CONFORMANCE_TESTS='TestAgnhostStandInRunsTheFrameworksCommands|TestConformance'

# make conformance on the dual-stack labs (e2e/conformance_dualstack_test.go):
# TestRealNodesDualStack, then e2e.test's [Feature:IPv6DualStack] specs on
# podnet and on the baseline, both dual-stack clusters (ULA underlay, both
# families' Service and cluster CIDRs, kubelets with both node IPs), side by
# side. The other variables of make conformance apply (CONFORMANCE_ONE_LAB=1
# runs the labs one after the other).
conformance-dualstack:
	$(MAKE) conformance CONFORMANCE_LABS='podnet-dualstack baseline-dualstack' \
		CONFORMANCE_FOCUS='\[sig-network\].*\[Feature:IPv6DualStack\]' \
		CONFORMANCE_TESTS='TestAgnhostStandInRunsTheFrameworksCommands|TestRealNodesDualStack|TestConformance'

# make conformance for NetworkPolicy: e2e.test's [Feature:NetworkPolicy]
# specs (48 in v1.36.3; 3 of them also [Feature:SCTPConnectivity]) on
# podnet in iptables and ebpf modes and on kube-network-policies (the
# kube-proxy+CoreDNS baseline with it enforcing), side by side.
# TestNFTQueueProbe says first whether this kernel can run
# kube-network-policies at all.
conformance-policy:
	$(MAKE) conformance CONFORMANCE_LABS='podnet podnet-ebpf kube-network-policies' \
		CONFORMANCE_FOCUS='\[Feature:NetworkPolicy\]' \
		CONFORMANCE_TESTS='TestAgnhostStandInRunsTheFrameworksCommands|TestNFTQueueProbe|TestConformance'

# Issue 20's DNS under disruption on real nodes (e2e/realnode_dns_test.go):
# TestRealNodesDNS starts the podnet lab and the baseline lab (kube-proxy,
# CoreDNS with kubeadm's Corefile) at once, three nodes each, drives both
# through the same steps under the same load (clients on every node at 200
# lookups/s over UDP and TCP: rolling update of the DNS Deployment, a node
# drained, scale 3 -> 1; parallel A+AAAA for DNS_RACE_SECONDS; node-local
# DNS with a local server killed; queries per external lookup with and
# without autopath) and prints one table of both.
DNS_LAB_TIMEOUT ?= 60m
DNS_RACE_SECONDS ?= 60
# DNS_ONE_LAB=1: the baseline lab after podnet's, not beside it.
DNS_ONE_LAB ?=
dns-lab: deps build apiserver image kube-node $(KUBE_PROXY) $(COREDNS)
	PODNET_BIN=$(CURDIR)/bin PODNET_KUBE_APISERVER=$(APISERVER) PODNET_IMAGE=$(CURDIR)/$(IMAGE) PODNET_KUBE_CACHE=$(APISERVER_CACHE) \
	PODNET_KUBE_PROXY=$(KUBE_PROXY) PODNET_COREDNS=$(COREDNS) PODNET_DNS_RACE_SECONDS=$(DNS_RACE_SECONDS) PODNET_DNS_ONE_LAB=$(DNS_ONE_LAB) \
		$(GO) test -tags conformance -count=1 -timeout $(DNS_LAB_TIMEOUT) -v -run '^TestRealNodesDNS$$' ./e2e/

# README's "Migrating from flannel, kube-proxy and CoreDNS" on three real
# nodes (e2e/migrate_test.go): TestFlannelNodes, the starting point alone
# (flannel of $(FLANNELD), kube-proxy in iptables mode and CoreDNS with a
# stub domain; pod to pod on every pair of nodes), then TestMigrate: the
# stages, README's commands word for word, under load from a client pod and
# from outside the cluster, one node rolled back to flannel and forward
# again; it prints a table of what each step lost.
# MIGRATE_CONFORMANCE=1 then runs make conformance's CONFORMANCE_FOCUS
# specs on the migrated cluster (e2e.test, agnhost and ginkgo as make
# conformance builds them: build them first; give MIGRATE_TIMEOUT room).
MIGRATE_TIMEOUT ?= 60m
MIGRATE_CONFORMANCE ?=
migrate: deps build apiserver image kube-node flannel $(KUBE_PROXY) $(COREDNS)
	PODNET_BIN=$(CURDIR)/bin PODNET_KUBE_APISERVER=$(APISERVER) PODNET_IMAGE=$(CURDIR)/$(IMAGE) PODNET_KUBE_CACHE=$(APISERVER_CACHE) \
	PODNET_FLANNELD=$(FLANNELD) PODNET_KUBE_PROXY=$(KUBE_PROXY) PODNET_COREDNS=$(COREDNS) \
	PODNET_MIGRATE_CONFORMANCE=$(MIGRATE_CONFORMANCE) PODNET_E2E_TEST=$(E2E_TEST) PODNET_AGNHOST=$(AGNHOST) PODNET_GINKGO=$(GINKGO) \
	PODNET_CONFORMANCE_FOCUS='$(CONFORMANCE_FOCUS)' PODNET_CONFORMANCE_SKIP='$(CONFORMANCE_SKIP)' \
	PODNET_CONFORMANCE_PROCS=$(CONFORMANCE_PROCS) PODNET_CONFORMANCE_BUDGET=$(CONFORMANCE_BUDGET) \
		$(GO) test -tags conformance -count=1 -timeout $(MIGRATE_TIMEOUT) -v -run '^(TestFlannelNodes|TestMigrate)$$' ./e2e/

# podnet's image as a docker-archive tarball (`ctr images import`, `docker
# load`), without a Docker engine: the final stage of the Dockerfile read by
# e2e/cmd/mkimage, its Debian packages installed by mmdebstrap (cached in
# $(APISERVER_CACHE)), the binaries from bin/.
IMAGE_TAG ?= ghcr.io/podnet/podnet:$(RELEASE)
IMAGE := bin/podnet-image.tar
image: bin/podnet bin/loopback bin/portmap bin/proxyd bin/dnsd
	$(GO) run ./e2e/cmd/mkimage --dockerfile Dockerfile --tag $(IMAGE_TAG) --out $(IMAGE) --cache-dir $(APISERVER_CACHE)

# Unit tests (no root needed) and root tests of single packages, then the
# end-to-end lab tests one package at a time. PODNET_BIN tells the e2e tests
# where the freshly built binaries are. With PODNET_STRICT=1 in the
# environment (.ci/run sets it) a test that lacks root, a tool or a kernel
# feature fails instead of skipping (dataplane/roottest).
test: deps build apiserver image kube-node
	bash scripts/check-bpf.sh
	$(GO) test -count=1 -timeout 20m $$($(GO) list ./... | grep -v /e2e)
	$(GO) test -run '^$$' -fuzz '^FuzzServe$$' -fuzztime $(FUZZTIME) ./dataplane/dns
	PODNET_BIN=$(CURDIR)/bin PODNET_KUBE_APISERVER=$(APISERVER) PODNET_IMAGE=$(CURDIR)/$(IMAGE) PODNET_KUBE_CACHE=$(APISERVER_CACHE) $(GO) test -count=1 -p 1 -timeout 25m ./e2e/...

demo: deps build
	./bin/podnet-lab demo $(if $(KEEP),--keep,)

demo-down:
	@test -x ./bin/podnet-lab || $(MAKE) bin/podnet-lab
	./bin/podnet-lab down

# The long benchmarks (hours of both cores; BENCH=dns,go selects parts). Each
# run's output is kept in bench-results/; the summary table of BENCHMARKS.md
# is printed at the end, with the figures of that run, and written back into
# BENCHMARKS.md with BENCH_WRITE=1. bench-table prints (or writes) it again
# from the kept runs, measuring nothing.
bench: deps build apiserver $(KUBE_PROXY) $(NFT_ROOT)/usr/sbin/nft
	PODNET_BIN=$(CURDIR)/bin PODNET_KUBE_APISERVER=$(APISERVER) PODNET_KUBE_PROXY=$(KUBE_PROXY) PODNET_NFT_ROOT=$(NFT_ROOT) bash scripts/bench.sh

bench-table:
	bash scripts/bench-table.sh

# The reliability scenarios at full size (make test runs them short); prints
# one table. Needs root.
soak: deps build apiserver
	PODNET_BIN=$(CURDIR)/bin PODNET_KUBE_APISERVER=$(APISERVER) bash scripts/soak.sh

# Beside vet and staticcheck: no function of podnet's own code (cmd/,
# dataplane/, scripts/ and e2e/: the lab, its commands and the image and
# real-node helpers) over cyclomatic complexity 20 or 80 lines unless its
# doc comment says why it must stay one piece, next to a //gocyclo:ignore
# or //funclen:ignore line. Test functions (_test.go) are not held to it.
# And a test skips only through dataplane/roottest, so that PODNET_STRICT=1
# (.ci/run) turns every skip for a missing root, tool or kernel feature
# into a failure. .ci/run runs this target after make test.
LINT_DIRS := cmd dataplane scripts e2e
lint:
	$(GO) vet ./...
	$(GO) vet -tags conformance ./e2e/
	$(GO) tool staticcheck ./...
	$(GO) tool staticcheck -tags conformance ./e2e/
	$(GO) tool gocyclo -over 20 -ignore '_test\.go$$' $(LINT_DIRS)
	$(GO) run ./scripts/funclen -max 80 $(LINT_DIRS)
	@if grep -rnE '\.Skip(f|Now)?\(' --include='*.go' $(LINT_DIRS) | grep -v '^dataplane/roottest/'; then \
		echo 'lint: tests skip through dataplane/roottest (Require, Tool, Unavailable, Optional), which PODNET_STRICT=1 turns into failures'; exit 1; fi

generate:
	$(GO) generate ./...

clean:
	rm -rf bin
