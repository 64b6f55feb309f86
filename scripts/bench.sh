#!/usr/bin/env bash
# make bench: long-running benchmarks, never part of make test.
set -euo pipefail
cd "$(dirname "$0")/.."
go test -run '^$' -bench . -benchtime 1x -timeout 60m ./...
