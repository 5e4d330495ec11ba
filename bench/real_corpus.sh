#!/usr/bin/env bash
# Run the full pipeline on the real English + Chinese corpus built by ../shared/data/build_corpus.sh
# and record wall time and peak memory (driver + Dask workers).
#
#   bash bench/real_corpus.sh [CORPUS_DIR] [OUT_DIR]
#
# CORPUS_DIR defaults to ../corpus-bench (built there, ~5 minutes, if missing); OUT_DIR to
# ../corpusmill-bench-run. Figures land in OUT_DIR/bench.json and OUT_DIR/report.md.
set -euo pipefail
HERE=$(cd "$(dirname "$0")/.." && pwd)
SHARED=${SHARED_DATA:-$HERE/../shared/data}
CORPUS=${1:-$HERE/../corpus-bench}
OUT=${2:-$HERE/../corpusmill-bench-run}
PY=$HERE/.venv/bin/python
[ -x "$PY" ] || { echo "run the Quickstart install first (.venv missing)" >&2; exit 2; }
"$PY" -c "import psutil" 2>/dev/null || "$HERE/.venv/bin/pip" install -q psutil
if [ ! -f "$CORPUS/MANIFEST.json" ]; then
  [ -x "$SHARED/build_corpus.sh" ] || { echo "no corpus at $CORPUS and no $SHARED/build_corpus.sh" >&2; exit 2; }
  bash "$SHARED/build_corpus.sh" "$CORPUS"
fi
TOKENIZER=$SHARED/kept/tokenizers/chinese-llama-2_tokenizer.model
mkdir -p "$OUT"
CONFIG=$OUT/../bench-real-corpus.yaml
sed -e "s#@CORPUS@#$CORPUS#g" -e "s#@TOKENIZER@#$TOKENIZER#g" "$HERE/bench/real_corpus.yaml" > "$CONFIG"
"$PY" "$HERE/bench/measure.py" --json "$OUT.bench.json" -- "$HERE/.venv/bin/corpusmill" run "$CONFIG" --out "$OUT"
mv "$OUT.bench.json" "$OUT/bench.json"
cat "$OUT/bench.json"
