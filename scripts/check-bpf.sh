#!/usr/bin/env bash
# Regenerates bpf/ into a temporary copy and fails when the committed
# objects or Go bindings differ from what the sources produce (someone
# edited the C without `make generate`, or the other way round).
set -euo pipefail
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
go build -o "$tmp/bpf2go" github.com/cilium/ebpf/cmd/bpf2go
mkdir "$tmp/bpf"
cp bpf/*.c bpf/*.h bpf/gen.go "$tmp/bpf/"
grep -h '^//go:generate go tool bpf2go ' bpf/*.go | sed 's|^//go:generate go tool bpf2go ||' | while read -r args; do
	(cd "$tmp/bpf" && eval "GOPACKAGE=bpf GOFILE=gen.go \"$tmp/bpf2go\" $args" >/dev/null)
done
status=0
for f in bpf/*_bpfel.o bpf/*_bpfel.go; do
	if ! cmp -s "$f" "$tmp/$f"; then
		echo "check-bpf: $f is not what its sources produce; run make generate" >&2
		status=1
	fi
done
for f in "$tmp"/bpf/*_bpfel.o "$tmp"/bpf/*_bpfel.go; do
	if [ ! -e "bpf/$(basename "$f")" ]; then
		echo "check-bpf: bpf/$(basename "$f") is missing; run make generate" >&2
		status=1
	fi
done
[ $status -eq 0 ] && echo "check-bpf: committed BPF objects match their sources"
exit $status
