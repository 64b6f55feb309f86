#!/usr/bin/env bash
# make bench: the long benchmarks, never part of make test. Each script prints
# its own figures; BENCHMARKS.md records what was measured and how. Needs root.
# BENCH=cni,routing,services,dns,go runs a subset.
set -euo pipefail
cd "$(dirname "$0")/.."
export PODNET_BIN="${PODNET_BIN:-$PWD/bin}"
want="${BENCH:-cni,routing,services,dns,go}"
status=0
run() {
	local name=$1
	shift
	case ",$want," in *",$name,"*) ;; *) return 0 ;; esac
	echo "==> $name: $*"
	if ! "$@"; then
		echo "==> $name: FAILED" >&2
		status=1
	fi
}
run cni bash scripts/bench-cni.sh
run routing bash scripts/bench-routing.sh
run services bash scripts/bench-services.sh
# dnsd against CoreDNS, both through the API server: 1,000 Services, and
# 10,000 for the memory target.
run dns bash scripts/bench-dns.sh 1000 10
run dns bash scripts/bench-dns.sh 10000 10
run go go test -run '^$' -bench . -benchmem -timeout 60m ./...
exit $status
