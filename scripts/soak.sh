#!/usr/bin/env bash
# make soak: the reliability scenarios of issue 15 at full size (minutes),
# never part of make test, which runs a short version of each. Each scenario
# asserts its goal (a regression fails it) and adds one row to the table
# printed at the end. Needs root, and kube-apiserver in $PODNET_KUBE_APISERVER
# for scenarios 2 (its API-server half) and 3 (make soak builds it). SOAK=
# TestSoakProxydKilled runs one.
set -euo pipefail
cd "$(dirname "$0")/.."
export PODNET_BIN="${PODNET_BIN:-$PWD/bin}"
export PODNET_SOAK=1
report=$(mktemp)
log=$(mktemp)
trap 'rm -f "$report" "$log"' EXIT
export PODNET_SOAK_REPORT=$report
status=0
go test -count=1 -p 1 -timeout 60m -v -run "${SOAK:-^TestSoak}" ./e2e/ 2>&1 | tee "$log" || status=$?
echo
echo "$(date -u '+%F %T UTC'), commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown), load average $(cut -d' ' -f1-3 /proc/loadavg)"
echo
echo "scenario | load | faults | failed requests or lost data | figure"
echo "--- | --- | --- | --- | ---"
cat "$report"
# A scenario that stopped before its row (t.Fatal, a panic, the timeout)
# is named here; a row that missed its goal starts with FAILED.
failed=$(grep -oE -- '^--- FAIL: TestSoak[A-Za-z0-9_]*' "$log" | sed 's/^--- FAIL: //' | tr '\n' ' ')
if [ -n "$failed" ]; then
	echo
	echo "missed their goal: $failed"
fi
if [ "$status" -eq 0 ] && grep -qE '^(FAIL|panic:)' "$log"; then
	status=1
fi
exit $status
