#!/usr/bin/env bash
# The regression gate checked against itself on one GPU, in at most ~540 s:
# Run from the repository root with $OUT set (an empty folder for the results):
#
#   OUT=/tmp/out bash plants/gate-experiment.sh
#
# Steps, each a separate pytest process of the quick gate selection (--gate-quick):
#   1. record a baseline on unchanged code into $OUT/work/base (selection: the committed
#      baseline's gated pairs, reports/baselines/)
#   2. three gate runs on unchanged code against it            (each must exit 0)
#   3. plants/slow10.patch applied: three gate runs             (each must exit 1 naming exactly
#      the stream path's cases, EXPECTED below), then reverted
#   4. plants/slow3.patch applied: one gate run                 (must exit 0), then reverted
# Every step has a timeout; a step that would not fit in what is left of BUDGET_S is skipped and
# says so, so the whole script ends within BUDGET_S + a few seconds whatever happens.
# Results: $OUT/summary.txt (also printed) and $OUT/logs.tar.gz (every run's full log, the
# plants' calibration lines, the recorded baseline).
set -u

BUDGET_S=${BUDGET_S:-525}
STEP_CAP_S=${STEP_CAP_S:-150}       # one gate run (expected 45-70 s)
RECORD_CAP_S=${RECORD_CAP_S:-200}   # the record run, which may compile everything (cold caches)
PY=${PY:-python3}
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(pwd)
: "${OUT:?set OUT to the folder for the results}"
WORK="$OUT/work"
BASE="$WORK/base"
mkdir -p "$BASE"
SUMMARY="$OUT/summary.txt"
: > "$SUMMARY"
START=$(date +%s)
# The stream path (Triton, 16-bit rows of 32769-65536, B >= 1024) at the gated shapes: the
# cases a slowdown of that path must fail, and the only ones.
EXPECTED="triton B=32768 V=50257 bfloat16 device
triton B=4096 V=50257 bfloat16 device"
PLANTED=""
MAX_RUN_S=0
VERDICTS=""

say() { echo "$*" | tee -a "$SUMMARY"; }
elapsed() { echo $(( $(date +%s) - START )); }

apply_patch() {  # apply_patch FILE [-R]: patch(1), else git apply (no repository needed), else apply_patch.py
    if command -v patch > /dev/null; then
        if [ "${2:-}" = -R ]; then patch -p1 -s -R < "$1"; else patch -p1 -s --forward < "$1"; fi
    elif command -v git > /dev/null; then
        git apply ${2:-} "$1"
    else
        "$PY" "$HERE/apply_patch.py" "$1" ${2:-}
    fi
}

revert() {
    if [ -n "$PLANTED" ]; then
        apply_patch "$PLANTED" -R && say "reverted $(basename "$PLANTED")" || say "REVERT FAILED: $PLANTED"
        PLANTED=""
    fi
}
trap revert EXIT

# run_gate NAME EXPECT ARGS... : EXPECT is record, pass or fail
run_gate() {
    local name=$1 expect=$2; shift 2
    local left=$(( BUDGET_S - $(elapsed) ))
    local need=$(( MAX_RUN_S * 11 / 10 ))
    if [ "$left" -lt 30 ] || [ "$left" -lt "$need" ]; then
        say "== $name: SKIPPED, ${left} s left of the budget (the longest run so far took ${MAX_RUN_S} s)"
        VERDICTS="$VERDICTS $name:skipped"
        return
    fi
    local cap=$([ "$name" = record ] && echo "$RECORD_CAP_S" || echo "$STEP_CAP_S")
    local limit=$(( left - 5 < cap ? left - 5 : cap ))
    local log="$WORK/$name.log"
    local t0=$(date +%s)
    SOFTMAX_PLANT_LOG="$WORK/plant.log" PYTHONUNBUFFERED=1 timeout -k 5 "$limit" \
        "$PY" -m pytest tests/test_benchmarks.py -m "cuda and gated" --benchmark-only --gate-quick \
        --no-reports -p no:cacheprovider -q "$@" > "$log" 2>&1
    local rc=$?
    local wall=$(( $(date +%s) - t0 ))
    [ "$name" != record ] && [ "$wall" -gt "$MAX_RUN_S" ] && MAX_RUN_S=$wall
    [ "$name" = record ] && MAX_RUN_S=$(( wall * 3 / 4 ))  # later runs are warm
    say "== $name: exit $rc in ${wall} s (limit ${limit} s; ${PLANTED:+planted $(basename "$PLANTED"); }$(elapsed) s since start)"
    grep -E "^(gate quick selection|regression gate|baseline for|no baseline|  a case fails|  [0-9]+ regressed|  REGRESSED|  within noise|  largest slowdown)|[0-9]+ (passed|failed|errors?)\b|^(E |ERROR|FAILED)" "$log" \
        | tail -n 40 | tee -a "$SUMMARY"
    local got ok
    got=$(grep -E "^  REGRESSED " "$log" | sed -E 's/^  REGRESSED +//; s/: .*//' | sort)
    case $expect in
        record) ok=$([ "$rc" = 0 ] && ls "$BASE"/*.json > /dev/null 2>&1 && echo yes || echo no) ;;
        pass) ok=$([ "$rc" = 0 ] && [ -z "$got" ] && echo yes || echo no) ;;
        fail) ok=$([ "$rc" = 1 ] && [ "$got" = "$(echo "$EXPECTED" | sort)" ] && echo yes || echo no) ;;
    esac
    say "   expected: $expect$([ "$expect" = fail ] && echo " naming exactly: $(echo "$EXPECTED" | tr '\n' ';')") -> $([ "$ok" = yes ] && echo AS EXPECTED || echo NOT AS EXPECTED)"
    [ "$expect" = fail ] && [ "$ok" != yes ] && say "   regressed cases named: $(echo "$got" | tr '\n' ';')"
    VERDICTS="$VERDICTS $name:$ok"
}

plant() {
    revert
    if apply_patch "$1"; then
        PLANTED=$1
        say "applied $(basename "$1"): $(grep -m1 '^+PLANT_FRACTION' "$1" | tr -d '+')"
        return 0
    fi
    say "could not apply $1"
    return 1
}

say "gate experiment: $(date -u +%FT%TZ), $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1)"
say "budget ${BUDGET_S} s, at most ${RECORD_CAP_S} s for the record run and ${STEP_CAP_S} s for each other; root ${ROOT}"

run_gate record record --record-baseline="$BASE" --benchmark-json="$OUT/gate-record.json"
GATE=(--regression-gate --regression-baseline="$BASE")
for i in 1 2 3; do run_gate "unchanged-$i" pass "${GATE[@]}"; done
if plant "$HERE/slow10.patch"; then
    for i in 1 2 3; do run_gate "slow10-$i" fail "${GATE[@]}"; done
fi
if plant "$HERE/slow3.patch"; then
    run_gate slow3 pass "${GATE[@]}"
fi
revert
[ -f "$WORK/plant.log" ] && { say "plant calibration:"; tee -a "$SUMMARY" < "$WORK/plant.log"; }
say "verdicts:$VERDICTS"
say "total $(elapsed) s"
tar -czf "$OUT/logs.tar.gz" -C "$OUT" work 2>/dev/null && rm -rf "$WORK"
