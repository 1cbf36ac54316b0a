#!/usr/bin/env bash
# The gms/nn redesign's before/after sitting (benchmarks/README.md, "arch_before_after.json").
#
#   tools/arch_sitting.sh OUT [ROUNDS]
#
# Makes a worktree of the commit before the redesign (078409d) with
# tools/patches/arch_before_078409d.patch applied (its rgcn.py and gms_kernels.py then write
# partial runs), and runs gms_kernels, rgcn, spconv and moe on both sides in one sitting,
# alternating (before, after, after, before, ...) so that drift hits both alike; gms_kernels
# (seconds per run) gets three times the rounds. Then compares the ratios and fusekit's own
# medians with tools/compare_results.py. Needs a quiet machine: about 8 minutes per round.
set -eu
out=$(realpath -m "$1"); rounds=${2:-3}
here=$(cd "$(dirname "$0")/.." && pwd); py=$here/.venv/bin/python
before=$out/wt-before
mkdir -p "$out"
if [ ! -d "$before" ]; then
  git -C "$here" worktree add -f "$before" 078409d
  git -C "$before" apply "$here/tools/patches/arch_before_078409d.patch"
fi
tree() { if [ "$1" = before ]; then echo "$before"; else echo "$here"; fi; }
run() {  # side round scripts...
  local side=$1 r=$2 dir; shift 2; dir=$out/$side$r; mkdir -p "$dir"
  (cd "$(tree "$side")" && export PYTHONPATH=$PWD/src && for s in "$@"; do
    case $s in
      gms) $py benchmarks/gms_kernels.py --quick --out "$dir/gms_kernels.json" ;;
      rgcn) $py benchmarks/rgcn.py --parts layer --repeats 5 --budget 2 --out "$dir/rgcn.json" ;;
      spconv) $py benchmarks/spconv.py --quick --out "$dir/spconv.json" ;;
      moe) $py benchmarks/moe.py --tokens 1,256 --train-tokens 4 --repeats 5 --budget 2 \
             --out "$dir/moe.json" ;;
    esac
  done) >> "$dir/log" 2>&1
  echo "$side$r $* done $(date +%T)"
}
for r in $(seq 1 "$rounds"); do
  a=before b=after; if [ $((r % 2)) = 0 ]; then a=after b=before; fi
  run $a "$r" gms rgcn spconv moe; run $b "$r" gms rgcn spconv moe
done
for r in $(seq $((rounds + 1)) $((3 * rounds))); do
  a=before b=after; if [ $((r % 2)) = 0 ]; then a=after b=before; fi
  run $a "$r" gms; run $b "$r" gms
done
bs=$(ls -d "$out"/before*[0-9]); as=$(ls -d "$out"/after*[0-9])
# shellcheck disable=SC2086
$py "$here/tools/compare_results.py" --before $bs --after $as \
  --out "$here/benchmarks/results/arch_rerun_ratios.json" || true
# shellcheck disable=SC2086
$py "$here/tools/compare_results.py" --times --before $bs --after $as \
  --out "$here/benchmarks/results/arch_rerun_times.json"
