// Package e2e holds the end-to-end tests: each test builds a cluster in
// network namespaces on this machine with the lab (package e2e/lab), runs the
// real binaries in it (the CNI plugin through libcni, proxyd, dnsd) and checks
// packets, not internal state.
//
// The tests need root and the binaries that `make build` puts into bin/;
// `make test` runs them with PODNET_BIN pointing there. Run one package at a
// time (-p 1): the lab is fast, but the machine has two cores.
package e2e
