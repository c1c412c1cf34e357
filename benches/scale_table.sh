#!/usr/bin/env bash
# The runtime's cost at scale (issue 17's table): `dtr gen chain` of 10^4,
# 10^5 and 10^6 layers replayed with `dtr-eq` unbounded (ratio 1.0) and at
# 0.1 of the peak with `--sampling all` and `--sampling sqrt`. Each cell is
# the whole process (reading the trace included): wall seconds, CPU
# seconds (user + system) and peak RSS, measured by GNU time. One replay per
# cell (`--no-suggest`: a run that stopped would otherwise search budgets).
#
#   benches/scale_table.sh                  # 10^4 10^5 10^6
#   LENGTHS="10000 100000" benches/scale_table.sh
#   ALL_UP_TO=100000 benches/scale_table.sh # `all` is quadratic: only up to this length
#
# Prints a Markdown table. Needs GNU time at /usr/bin/time.
set -euo pipefail

LENGTHS=${LENGTHS:-"10000 100000 1000000"}
ALL_UP_TO=${ALL_UP_TO:-100000}
cd "$(dirname "$0")/.."
cargo build --release --quiet --bin dtr
DTR=$PWD/target/release/dtr
if [[ ! -x /usr/bin/time ]]; then
    echo "needs GNU time at /usr/bin/time" >&2
    exit 1
fi
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

# One replay: "wall s / cpu s / peak MB".
measure() {
    local trace=$1
    shift
    /usr/bin/time -o "$WORK/time" -f "%e %U %S %M" \
        "$DTR" replay --heuristic dtr-eq --no-suggest "$@" "$trace" >"$WORK/out" 2>&1 || {
        cat "$WORK/out" >&2
        echo "failed"
        return
    }
    read -r wall user sys rss <"$WORK/time"
    awk -v w="$wall" -v u="$user" -v s="$sys" -v r="$rss" \
        'BEGIN { printf "%.2f s (%.2f s CPU), %.0f MB", w, u + s, r / 1024 }'
}

echo "| layers (events) | ratio 1.0 | ratio 0.1, \`--sampling all\` | ratio 0.1, \`--sampling sqrt\` |"
echo "|---|---:|---:|---:|"
for n in $LENGTHS; do
    trace="$WORK/chain$n.trace"
    # Its `wrote …` note goes to stderr: kept out of the table unless it fails.
    "$DTR" gen chain --length "$n" --out "$trace" >/dev/null 2>"$WORK/gen" || {
        cat "$WORK/gen" >&2
        exit 1
    }
    unbounded=$(measure "$trace" --ratio 1.0)
    if ((n <= ALL_UP_TO)); then
        all=$(measure "$trace" --ratio 0.1 --sampling all)
    else
        all="—"
    fi
    sqrt=$(measure "$trace" --ratio 0.1 --sampling sqrt)
    echo "| $n ($((4 * n))) | $unbounded | $all | $sqrt |"
    rm -f "$trace"
done
