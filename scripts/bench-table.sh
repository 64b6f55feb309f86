#!/usr/bin/env bash
# make bench-table: BENCHMARKS.md's summary table from the runs make bench
# kept ($BENCH_RESULTS, default bench-results/), measuring nothing.
# BENCH_WRITE=1 writes it back into BENCHMARKS.md.
set -euo pipefail
cd "$(dirname "$0")/.."
results="${BENCH_RESULTS:-bench-results}"
mapfile -t all < <(ls "$results"/*/results.tsv 2>/dev/null | sort)
go run ./scripts/benchtable table -doc BENCHMARKS.md ${BENCH_WRITE:+-write} "${all[@]}"
