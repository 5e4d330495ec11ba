"""The run directory's one owner: where each step's folder, marker, parts and the run's own files live.

A run directory (`corpusmill run/dedup --out DIR`) holds one folder per step (`00-read/` ...
`shards/`), each with its Parquet/Arrow parts, a `removed/` folder of audit rows and a `_DONE.json`
completion marker written last; beside them `config.yaml`, `progress.json`, `ledger.json`,
`report.md`. Everything that names one of these paths asks this module, so the service can read a
run's status without importing Dask or a stage (see docs/ARCHITECTURE.md, "The run directory").
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any, Optional

from corpusmill.stages.base import write_json_atomic

# step name -> folder name; the numbers sort the folders in the order a full run makes them
STAGE_DIRS = {
    "read": "00-read",
    "normalize": "01-normalize",
    "filter": "02-filter",
    "reference_dedup": "02b-reference_dedup",
    "exact_dedup": "03-exact_dedup",
    "near_dedup": "04-near_dedup",
    "dedup_index": "04b-dedup_index",
    "decontaminate": "04c-decontaminate",
    "tokenize": "05-tokenize",
    "pack": "06-pack",
    "shard": "shards",
}
MARKER = "_DONE.json"  # written last into a step's folder: the step finished with this config hash
REMOVED = "removed"  # a step's audit rows: one row per document it removed, with the reason
CONFIG_FILE = "config.yaml"
LEDGER_FILE = "ledger.json"
SHARDS_STAGING = "shards.tmp"  # MindRecord files are written here, then the folder is renamed to shards/
VALIDATION_SHARDS = "shards-validation"  # the held-out split's own shards and manifest (split.validation)
EXPORT_KEPT, EXPORT_REMOVED = "kept", "removed"  # what a dedup job hands over


class RunDir:
    """Paths and markers of one run directory."""

    def __init__(self, root: str | Path):
        self.root = Path(root)

    def folder(self, step: str) -> Path:
        return self.root / STAGE_DIRS[step]

    def parts(self, step: str) -> list[str]:
        """A step's document or token parts, in the order their names sort (the corpus order)."""
        folder = self.folder(step)
        return sorted(str(p) for p in [*folder.glob("part-*.parquet"), *folder.glob("part-*.arrow")])

    def removed_files(self, step: str) -> list[str]:
        return sorted(str(p) for p in (self.folder(step) / REMOVED).glob("*.parquet"))

    def scores_cache(self, step: str) -> Path:
        """Where a step keeps what a rerun with a changed threshold may reuse (`02-filter.scores/`)."""
        return self.root / (STAGE_DIRS[step] + ".scores")

    def marker(self, step: str) -> Optional[dict[str, Any]]:
        """The step's completion marker, or None when it never finished."""
        path = self.folder(step) / MARKER
        if not path.is_file():
            return None
        return json.loads(path.read_text(encoding="utf-8"))

    def write_marker(self, step: str, marker: dict[str, Any]) -> None:
        write_json_atomic(self.folder(step) / MARKER, marker)

    def fresh_folder(self, step: str) -> Path:
        """The step's folder, emptied: a step never builds on what an unfinished earlier try left."""
        folder = self.folder(step)
        if folder.exists():
            shutil.rmtree(folder)
        folder.mkdir(parents=True)
        return folder

    def file(self, name: str) -> Path:
        """A file or folder of the run itself (config.yaml, ledger.json, kept/, shards.tmp/ ...)."""
        return self.root / name
