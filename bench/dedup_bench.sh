#!/usr/bin/env bash
# Near-duplicate benchmark, corpusmill vs text-dedup vs datatrove, side by side in one run.
#
#   bash bench/dedup_bench.sh [DOCS] [BENCH_DIR]
#
# 1. builds the real corpus with ../shared/data/build_corpus.sh (if ../corpus-bench has none),
# 2. makes a labelled benchmark corpus of DOCS base documents (default 100000) with planted near and
#    exact duplicates (bench/dedup_corpus.py),
# 3. installs each anchor in its own venv under ../corpusmill-anchors (text-dedup 0.4.0;
#    datatrove[processing] 0.10.1 with orjson and spaCy),
# 4. runs bench/dedup_bench.py: quality per Jaccard band, wall/CPU seconds, docs/s, MB/s, peak RSS.
set -euo pipefail
HERE=$(cd "$(dirname "$0")/.." && pwd)
DOCS=${1:-100000}
BENCH=${2:-$HERE/../corpusmill-dedup-bench-$DOCS}
CORPUS=${CORPUS:-$HERE/../corpus-bench}
ANCHORS=${ANCHORS:-$HERE/../corpusmill-anchors}
PY=$HERE/.venv/bin/python
[ -x "$PY" ] || { echo "run the Quickstart install first (.venv missing)" >&2; exit 2; }
"$PY" -c "import psutil" 2>/dev/null || "$HERE/.venv/bin/pip" install -q psutil
if [ ! -f "$CORPUS/MANIFEST.json" ]; then bash "$HERE/../shared/data/build_corpus.sh" "$CORPUS"; fi
[ -f "$BENCH/truth.jsonl" ] || "$PY" "$HERE/bench/dedup_corpus.py" "$CORPUS" "$BENCH" --docs "$DOCS"
mkdir -p "$ANCHORS"
if [ ! -x "$ANCHORS/td/bin/python" ]; then
  python3 -m venv "$ANCHORS/td" && "$ANCHORS/td/bin/pip" install -q "text-dedup==0.4.0"
fi
if [ ! -x "$ANCHORS/dt/bin/python" ]; then
  python3 -m venv "$ANCHORS/dt" && "$ANCHORS/dt/bin/pip" install -q "datatrove[processing]==0.10.1" orjson spacy
fi
"$PY" "$HERE/bench/dedup_bench.py" "$BENCH" --anchors "$ANCHORS" "${@:3}"
