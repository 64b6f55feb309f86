# podnet: `make demo` runs the lab, `make test` runs every test. Both install
# what they need first (Debian packages via scripts/deps.sh, Go modules via go).

GO       ?= go
VERSION  ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS  := -s -w -X github.com/podnet/podnet/dataplane/version.Version=$(VERSION)
GOFLAGS_BUILD := -trimpath -ldflags '$(LDFLAGS)'
export CGO_ENABLED ?= 0

# How long make test fuzzes dnsd's query path (seed corpus always runs).
FUZZTIME ?= 20s

BINARIES := bin/podnet bin/loopback bin/proxyd bin/dnsd bin/podnet-lab

.PHONY: all build deps test demo demo-down bench lint generate clean apiserver

all: build

build: $(BINARIES)

bin/podnet: FORCE
	$(GO) build $(GOFLAGS_BUILD) -o $@ ./cmd/cni-plugin
# The CNI reference loopback plugin: container runtimes run it for every pod
# sandbox, and `podnet install` installs it beside podnet when a node has none.
bin/loopback: FORCE
	$(GO) build $(GOFLAGS_BUILD) -o $@ github.com/containernetworking/plugins/plugins/main/loopback
bin/proxyd: FORCE
	$(GO) build $(GOFLAGS_BUILD) -o $@ ./cmd/proxyd
bin/dnsd: FORCE
	$(GO) build $(GOFLAGS_BUILD) -o $@ ./cmd/dnsd
bin/podnet-lab: FORCE
	$(GO) build $(GOFLAGS_BUILD) -o $@ ./e2e/cmd/podnet-lab
FORCE:

deps:
	@bash scripts/deps.sh

# A real kube-apiserver for the e2e tests, built once from the Go module proxy
# by the tools module in e2e/apiserver/tools (the first build takes minutes)
# and cached outside the tree. Its version is the one that module requires.
APISERVER_VERSION := v1.36.3
APISERVER_CACHE ?= /var/cache/podnet
APISERVER := $(APISERVER_CACHE)/kube-apiserver-$(APISERVER_VERSION)

apiserver: $(APISERVER)
$(APISERVER):
	mkdir -p $(APISERVER_CACHE)
	cd e2e/apiserver/tools && $(GO) build -trimpath \
		-ldflags '-s -w -X k8s.io/component-base/version.gitVersion=$(APISERVER_VERSION)' \
		-o $@.tmp k8s.io/kubernetes/cmd/kube-apiserver
	mv $@.tmp $@

# Unit tests (no root needed) and root tests of single packages, then the
# end-to-end lab tests one package at a time. PODNET_BIN tells the e2e tests
# where the freshly built binaries are.
test: deps build apiserver
	bash scripts/check-bpf.sh
	$(GO) test -count=1 -timeout 20m $$($(GO) list ./... | grep -v /e2e)
	$(GO) test -run '^$$' -fuzz '^FuzzServe$$' -fuzztime $(FUZZTIME) ./dataplane/dns
	PODNET_BIN=$(CURDIR)/bin PODNET_KUBE_APISERVER=$(APISERVER) $(GO) test -count=1 -p 1 -timeout 25m ./e2e/...

demo: deps build
	./bin/podnet-lab demo $(if $(KEEP),--keep,)

demo-down:
	@test -x ./bin/podnet-lab || $(MAKE) bin/podnet-lab
	./bin/podnet-lab down

bench: deps build apiserver
	PODNET_BIN=$(CURDIR)/bin PODNET_KUBE_APISERVER=$(APISERVER) bash scripts/bench.sh

lint:
	$(GO) vet ./...
	$(GO) tool staticcheck ./...

generate:
	$(GO) generate ./...

clean:
	rm -rf bin
