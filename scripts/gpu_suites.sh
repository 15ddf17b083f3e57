#!/usr/bin/env bash
# The GPU suite once per renderer, all renderers' passes at the same time: PYTHON -m pytest
# tests/gpu with VKGRAPH_DEVICE=R for each R given, each pass in a process and log of its own,
# the logs printed in turn once all have finished; exits non-zero if any pass failed. (Much of a
# pass keeps one core busy: compiling shaders, the validation layer, Python.)
#   scripts/gpu_suites.sh PYTHON RENDERER... [-- PYTEST_ARGS...]
set -u
python=$1; shift
renderers=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do renderers+=("$1"); shift; done
[ $# -gt 0 ] && shift
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
pids=()
for r in "${renderers[@]}"; do
    VKGRAPH_DEVICE=$r "$python" -m pytest tests/gpu -p no:cacheprovider "$@" > "$logs/$r.log" 2>&1 &
    pids+=($!)
done
status=0
for i in "${!renderers[@]}"; do
    wait "${pids[$i]}"
    rc=$?
    echo "=== GPU suite on ${renderers[$i]}: exit status $rc"
    cat "$logs/${renderers[$i]}.log"
    [ $rc -eq 0 ] || status=1
done
exit $status
