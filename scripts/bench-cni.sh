#!/usr/bin/env bash
# CNI ADD/DEL latency: podnet against the reference bridge + host-local
# plugins (built from the module cache at the version go.mod pins), same
# subnet and MTU, sequential and 20 at a time, median and p99. Needs root;
# everything runs in network namespaces the benchmark creates and removes.
#
#   scripts/bench-cni.sh                 # 100 sequential pairs, 10 rounds of 20
#   BENCH_SEQ=300 BENCH_ROUNDS=20 scripts/bench-cni.sh
#
# Uses $PODNET_BIN/podnet if PODNET_BIN is set (make bench), else builds it.
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ $(id -u) != 0 ]]; then
	echo "bench-cni: needs root (creates network namespaces)" >&2
	exit 1
fi
go test -tags cnibench -count=1 -timeout 30m -run '^TestBenchCNI$' -v ./dataplane/cni |
	grep -v -e '^=== ' -e '^--- PASS' -e '^PASS$' -e '^ok '
