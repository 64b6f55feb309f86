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
trap 'rm -f "$report"' EXIT
export PODNET_SOAK_REPORT=$report
status=0
go test -count=1 -p 1 -timeout 60m -v -run "${SOAK:-^TestSoak}" ./e2e/ || status=$?
echo
echo "scenario | load | faults | failed requests or lost data | figure"
echo "--- | --- | --- | --- | ---"
cat "$report"
exit $status
