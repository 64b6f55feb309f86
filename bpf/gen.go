// Package bpf holds podnet's BPF programs (C, built by bpf2go with
// clang-19) and their generated Go bindings. The objects are committed, so
// building podnet needs no clang; `make generate` rebuilds them and
// `make test` checks that they match the sources.
package bpf

//go:generate go tool bpf2go -cc clang-19 -cflags "-O2 -g -Wall -Werror" -strip llvm-strip-19 -target bpfel -type svc_key -type svc_val -type backend -type nodeaddr_key -type revnat_key -type revnat_val -type affinity_key -type affinity_val Sock sock.c
//go:generate go tool bpf2go -cc clang-19 -cflags "-O2 -g -Wall -Werror" -strip llvm-strip-19 -target bpfel -type ct_key -type ct_fwd_val -type ct_rev_val -type srcrange_key -type snat_addr -type maglev_table Nodeport nodeport.c
//go:generate go tool bpf2go -cc clang-19 -cflags "-O2 -g -Wall -Werror" -strip llvm-strip-19 -target bpfel -type term_key Sockterm sockterm.c
