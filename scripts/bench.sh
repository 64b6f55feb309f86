#!/usr/bin/env bash
# make bench: the long benchmarks, never part of make test. Needs root.
# BENCH=cni,routing,services,dns,policy,go runs a subset.
#
# Each part prints its own figures as it runs, and its output is kept in a
# run directory, $BENCH_RESULTS/<UTC time>-<commit>/ (default bench-results/,
# not in git): PART.out per part that passed (PART.failed otherwise) and
# meta.tsv (date, commit, load, kernel, iptables). Then scripts/benchtable
# picks the summary's figures out of them into results.tsv and prints
# BENCHMARKS.md's summary table: its rows, each replaced by the newest run's
# figure where a run measured it. BENCH_WRITE=1 also writes the table back
# into BENCHMARKS.md between its summary markers.
set -euo pipefail
cd "$(dirname "$0")/.."
export PODNET_BIN="${PODNET_BIN:-$PWD/bin}"
want="${BENCH:-cni,routing,services,dns,policy,go}"
results="${BENCH_RESULTS:-bench-results}"
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
if ! git diff --quiet HEAD 2>/dev/null; then
	commit+="+changes"
fi
dir="$results/$(date -u +%Y%m%dT%H%M%SZ)-$commit"
mkdir -p "$dir"
{
	printf 'date\t%s\n' "$(date -u '+%F %H:%M UTC')"
	printf 'commit\t%s\n' "$commit"
	printf 'load\t%s\n' "$(cut -d' ' -f1-3 /proc/loadavg)"
	printf 'kernel\t%s\n' "$(uname -r)"
	printf 'iptables\t%s\n' "$(iptables --version 2>/dev/null || echo none)"
	printf 'parts\t%s\n' "$want"
} >"$dir/meta.tsv"
echo "==> results in $dir"
status=0
# run PART FILE CMD...: run CMD when PART is wanted, its output into FILE.out.
run() {
	local name=$1 file=$2
	shift 2
	case ",$want," in *",$name,"*) ;; *) return 0 ;; esac
	echo "==> $name: $*"
	if ! "$@" 2>&1 | tee "$dir/$file.out"; then
		mv "$dir/$file.out" "$dir/$file.failed"
		echo "==> $name: FAILED (output in $dir/$file.failed)" >&2
		status=1
	fi
}
run cni cni bash scripts/bench-cni.sh
run routing routing bash scripts/bench-routing.sh
run services services bash scripts/bench-services.sh
# dnsd against CoreDNS, both through the API server: 1,000 Services, and
# 10,000 for the memory target.
run dns dns-1000 bash scripts/bench-dns.sh 1000 10
run dns dns-10000 bash scripts/bench-dns.sh 10000 10
# NetworkPolicy (issue 24), side by side in one part: full programming and
# first-packet latency of 1,000 policies over 5,000 pods, one change to
# enforcement, Pod memory, and proxyd's RSS growth fed the same world.
run policy policy-go go test -count=1 -run '^$' -bench 'BenchmarkProgramFull|BenchmarkFirstPacket|BenchmarkEnforce|BenchmarkCompile|BenchmarkIncremental|BenchmarkPodMemoryPer1000|BenchmarkWorldHeap' -timeout 60m ./dataplane/policy/
run policy policy-rss env PODNET_BENCH=1 go test -count=1 -run '^$' -bench 'BenchmarkProxydPolicyRSS' -benchtime 1x -timeout 30m ./e2e/
run go go go test -run '^$' -bench . -benchmem -timeout 60m ./...

go run ./scripts/benchtable extract "$dir"
# Every run's results, oldest first: the newest figure of a row wins.
mapfile -t all < <(ls "$results"/*/results.tsv | sort)
echo
echo "==> summary (BENCHMARKS.md's rows, with the figures of $results/*/results.tsv)"
go run ./scripts/benchtable table -doc BENCHMARKS.md ${BENCH_WRITE:+-write} "${all[@]}"
exit $status
