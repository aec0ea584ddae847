#!/usr/bin/env bash
# A regression gate as a CI user would write it (the steps of a GitHub Actions job, as shell):
# measure the base, measure the new code, gate with `perflab.compare`, keep the JSON and the
# github-action-benchmark lists as artifacts, and act on the exit code:
#   0 pass, 1 fail (a regression beyond the gate), 2 usage error, 3 could not judge.
# Four cases: the same code (expect 0, or 3 on a machine too noisy to judge 10 %), the same code
# on a runner with more threads (expect 3: INCOMPARABLE), new code that does its matmuls twice
# (expect 1: FAIL), and a gate asked of 3 samples a side at 1 % (expect 3: INCONCLUSIVE).
# One thread per job (OMP_NUM_THREADS=1), as the README advises on a shared machine.
#
#   bash benchmarks/ci_gate.sh [PYTHON] | tee benchmarks/results/ci_gate.txt
set -u
PY=${1:-${PYTHON:-python}}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
cd "$WORK"
export OMP_NUM_THREADS=1
JOB=(+experiment=quick/matmul experiment.size=384 bench.repeats=20 results.table=false)

step() { echo; echo "::group::$*"; }
gate() {  # gate NAME BASE NEW [compare flags]: run the gate, print its verdict and exit code
    local name=$1 base=$2 new=$3; shift 3
    "$PY" -m perflab.compare "$base" "$new" "$@" --format json >"$name.json" 2>"$name.err"
    local rc=$?
    "$PY" -m perflab.compare "$base" "$new" "$@" --format github >"$name.github.json" 2>/dev/null
    "$PY" - "$name.json" <<'PYEOF'
import json, sys
out = json.load(open(sys.argv[1]))
for p in out["points"]:
    print(f"  {p['measurement']}: {p['verdict']}: {p['why']}")
print(f"  verdict: {out['verdict']} (gate {out['gate_pct']:g} %)")
PYEOF
    tail -n 1 "$name.err"
    echo "  exit code: $rc"
    echo "::endgroup::"
    return $rc
}

step "base: measure the code on main"
"$PY" -m perflab "${JOB[@]}" results.store=base results.subject=main >/dev/null 2>&1 || exit 2
step "new: the same code again"
"$PY" -m perflab "${JOB[@]}" results.store=same results.subject=pr-same >/dev/null 2>&1 || exit 2
gate same base same --fail-if-slower 10; same=$?

step "new: the same code on a runner with two threads (OMP_NUM_THREADS=2)"
OMP_NUM_THREADS=2 "$PY" -m perflab "${JOB[@]}" results.store=onethread results.subject=pr-same >/dev/null 2>&1 || exit 2
gate onethread base onethread --fail-if-slower 10; onethread=$?

step "new: code that does every matmul twice (the code under test became 2x slower)"
"$PY" - <<'PYEOF' >/dev/null 2>&1 || exit 2
import perflab, perflab.measure.alone_together as parallel
original = parallel.alone_then_together
parallel.alone_then_together = lambda ctx, work, **kw: original(ctx, lambda d: (work(d), work(d)), **kw)
perflab.run("quick/matmul", ["experiment.size=384", "bench.repeats=20", "results.table=false",
                             "results.store=slower", "results.subject=pr-slower"])
PYEOF
gate slower base slower --fail-if-slower 10; slower=$?

step "a gate asked too much: 3 samples a side at 1 %"
"$PY" -m perflab +experiment=quick/matmul bench.repeats=3 bench.min_time_s=0 results.table=false results.store=b3 >/dev/null 2>&1
"$PY" -m perflab +experiment=quick/matmul bench.repeats=3 bench.min_time_s=0 results.table=false results.store=n3 >/dev/null 2>&1
gate few b3 n3 --fail-if-slower 1; few=$?

step "history over what this job measured (two subjects: too little to judge)"
"$PY" -m perflab.history base slower >/dev/null 2>history.err; hist=$?
tail -n 2 history.err; echo "  exit code: $hist"

echo
echo "exit codes: same code $same, two-thread runner $onethread, 2x slower code $slower, 3 samples at 1 % $few, history $hist"
[ "$onethread" -eq 3 ] && [ "$slower" -eq 1 ] && [ "$few" -eq 3 ] && [ "$same" -ne 1 ] && [ "$hist" -eq 3 ]
