#!/usr/bin/env bash
# Scaling of `corpusmill dedup` (exact + MinHash): wall time and peak RSS at 1x and 4x corpus size,
# on the real corpus built by ../shared/data/build_corpus.sh (4x = all of it, 1x = every 4th line).
#
#   bash bench/dedup_scaling.sh [CORPUS_DIR] [WORK_DIR]
set -euo pipefail
HERE=$(cd "$(dirname "$0")/.." && pwd)
CORPUS=${1:-$HERE/../corpus-bench}
WORK=${2:-$HERE/../corpusmill-dedup-scaling}
PY=$HERE/.venv/bin/python
[ -f "$CORPUS/MANIFEST.json" ] || bash "$HERE/../shared/data/build_corpus.sh" "$CORPUS"
mkdir -p "$WORK/quarter"
for lang in en zh; do
  mkdir -p "$WORK/quarter/$lang"
  for f in "$CORPUS/$lang"/*.jsonl; do awk 'NR % 4 == 1' "$f" > "$WORK/quarter/$lang/$(basename "$f")"; done
done
for scale in 1x 4x; do
  if [ $scale = 1x ]; then IN="$WORK/quarter"; else IN="$CORPUS"; fi
  rm -rf "$WORK/run-$scale"
  "$PY" "$HERE/bench/measure.py" --json "$WORK/$scale.json" -- "$HERE/.venv/bin/corpusmill" dedup "$IN/en" "$IN/zh" \
      --out "$WORK/run-$scale" --methods exact,minhash > "$WORK/$scale.log" 2>&1
  echo "$scale: $(du -sh "$IN" | cut -f1) input; $(cat "$WORK/$scale.json" | tr -d '\n ')"
done
