"""The run directory's one owner: where each step's folder, marker, parts and the run's own files live.

A run directory (`corpusmill run/dedup --out DIR`) holds one folder per step (`00-read/` ...
`shards/`), each with its Parquet/Arrow parts, a `removed/` folder of audit rows and a `_DONE.json`
completion marker written last; beside them `config.yaml`, `progress.json`, `ledger.json`,
`report.md`. Everything that names one of these paths asks this module, so the service can read a
run's status without importing Dask or a stage (see docs/architecture.md, "The run directory").
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any, Optional

from corpusmill.stages.base import write_json_atomic

# step name -> folder name; the numbers sort the folders in the order a full run makes them
STAGE_DIRS = {
    "read": "00-read",
    "normalize": "01-normalize",
    "filter": "02-filter",
    "pii": "02b-pii",
    "reference_dedup": "02b-reference_dedup",
    "exact_dedup": "03-exact_dedup",
    "near_dedup": "04-near_dedup",
    "paragraph_dedup": "04a-paragraph_dedup",
    "dedup_index": "04b-dedup_index",
    "decontaminate": "04c-decontaminate",
    "tokenize": "05-tokenize",
    "pack": "06-pack",
    "shard": "shards",
}
MARKER = "_DONE.json"  # written last into a step's folder: the step finished with this config hash
TASKS = "_tasks"  # one marker per finished task of a step: an unfinished step resumes from them
REMOVED = "removed"  # a step's audit rows: one row per document it removed, with the reason
CONFIG_FILE = "config.yaml"
LEDGER_FILE = "ledger.json"
SHARDS_STAGING = "shards.tmp"  # MindRecord files are written here, then the folder is renamed to shards/
VALIDATION_SHARDS = "shards-validation"  # the held-out split's own shards and manifest (split.validation)
EXPORT_KEPT, EXPORT_REMOVED = "kept", "removed"  # what a dedup job hands over


def file_stamp(path: str | Path) -> list[int]:
    """Size and modification time of a file a task wrote: a part truncated or rewritten after the task
    committed it no longer matches, and the task reruns."""
    st = os.stat(path)
    return [st.st_size, st.st_mtime_ns]


DIGEST = "xxh3_128"  # the checksum a run records of the files a later run reads (its dedup index)


def file_digest(path: str | Path, chunk: int = 8 << 20) -> str:
    """XXH3-128 of a file's bytes, read in pieces (several GB/s: a whole run's index is checked in
    seconds, where sha256 would take minutes)."""
    import xxhash

    h = xxhash.xxh3_128()
    with open(path, "rb") as f:
        while True:
            block = f.read(chunk)
            if not block:
                return h.hexdigest()
            h.update(block)


def describe_files(root: Path, rels: list[str]) -> dict[str, dict[str, Any]]:
    """{path relative to `root`: {bytes, xxh3_128}} of files a later run will read, recorded when they
    are written, so a damaged, cut or swapped file is named before that run does any work."""
    return {rel: {"bytes": os.path.getsize(root / rel), DIGEST: file_digest(root / rel)} for rel in rels}


def verify_files(root: Path, recorded: dict[str, Any]) -> list[str]:
    """One line per recorded file that is missing, of another size or another checksum."""
    problems = []
    for rel, want in sorted(recorded.items()):
        path = root / rel
        try:
            size = os.path.getsize(path)
        except OSError as e:
            problems.append(f"{path}: {'missing' if isinstance(e, FileNotFoundError) else e.strerror or e}")
            continue
        if not isinstance(want, dict) or size != want.get("bytes"):
            problems.append(f"{path}: {size:,} bytes, {want.get('bytes') if isinstance(want, dict) else '?'} when the "
                            "index was written (cut, grown or replaced)")
        elif file_digest(path) != want.get(DIGEST):
            problems.append(f"{path}: its {DIGEST} checksum differs from the one recorded when the index was written "
                            "(the bytes were changed)")
    return problems


def read_task_marker(path: Path) -> Optional[dict[str, Any]]:
    """A task marker ({link, fingerprint, files, result}), or None when it is unreadable (a marker
    is written atomically, so that means it was damaged after the fact: the task reruns)."""
    try:
        task = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    ok = (isinstance(task, dict) and isinstance(task.get("files"), list) and "result" in task
          and isinstance(task.get("stamps"), list) and len(task["stamps"]) == len(task["files"]))
    inside = ok and all(isinstance(f, str) and not Path(f).is_absolute() and ".." not in Path(f).parts for f in task["files"])
    return task if inside else None


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

    def resume_folder(self, step: str, link: str) -> tuple[Path, int]:
        """The step's folder holding only what finished tasks of an earlier try with this link
        committed (their task markers and the files those name); everything else, a half-written
        temporary file included, is removed. Returns the folder and how many tasks it keeps."""
        folder = self.folder(step)
        if folder.is_symlink() or not folder.is_dir():  # a linked folder is never walked (fresh_folder refuses it)
            return self.fresh_folder(step), 0
        keep: set[Path] = set()
        for marker in sorted((folder / TASKS).glob("*.json")):
            task = read_task_marker(marker)
            if task is None or task.get("link") != link or not all(
                    (folder / f).is_file() and file_stamp(folder / f) == stamp for f, stamp in zip(task["files"], task["stamps"])):
                continue  # another config's task, or a file changed since the task committed it: it reruns
            keep.add(marker)
            keep.update(folder / f for f in task["files"])
        for path in sorted(folder.rglob("*"), key=lambda p: len(p.parts), reverse=True):  # files before their folders
            if path in keep:
                continue
            if path.is_dir() and not path.is_symlink():
                if not any(path.iterdir()):
                    path.rmdir()
            else:
                path.unlink()
        (folder / TASKS).mkdir(exist_ok=True)
        return folder, sum(1 for p in keep if p.parent == folder / TASKS)

    def file(self, name: str) -> Path:
        """A file or folder of the run itself (config.yaml, ledger.json, kept/, shards.tmp/ ...)."""
        return self.root / name


# ---- publishing a run's results to object storage (`--out s3://...`) ------------------------------

REPORT_FILES = ("report.md", "report.html")
QUARANTINE_REL = "00-read/quarantine.jsonl"  # the read step's quarantine rows (stages of a run keep their folders)


def published_files(root: Path, job: str) -> tuple[list[str], list[str]]:
    """(files, completion files) a run publishes, relative to its directory. The completion files go
    last, in this order: the ledger, then each shard set's manifest.json, the training set's at the
    very end, so a reader that finds shards/manifest.json finds every file it lists. Step markers
    and task records stay local."""
    root = Path(root)
    folders = [STAGE_DIRS["shard"], VALIDATION_SHARDS] if job != "dedup" else [EXPORT_KEPT, EXPORT_REMOVED]
    folders.append(STAGE_DIRS["dedup_index"])  # written only with dedup.write_index: a later run's reference
    files: list[str] = []
    for folder in folders:
        base = root / folder
        if not base.is_dir():
            continue
        for p in sorted(base.rglob("*")):
            rel = p.relative_to(root).as_posix()
            if p.is_file() and not p.is_symlink() and p.name != MARKER and f"/{TASKS}/" not in f"/{rel}":
                files.append(rel)
    files += [name for name in (CONFIG_FILE, QUARANTINE_REL, *REPORT_FILES) if (root / name).is_file()]
    last = [f"{VALIDATION_SHARDS}/manifest.json", f"{STAGE_DIRS['shard']}/manifest.json"]
    completion = [LEDGER_FILE] if (root / LEDGER_FILE).is_file() else []
    completion += [rel for rel in last if rel in files]
    return [f for f in files if f not in completion], completion


def publish(root: Path, url: str, job: str, log: Any = print) -> dict[str, int]:
    """Upload a finished run's results (`published_files`) to the prefix `url`: first the completion
    files already there are removed (a reader never takes an old manifest for a new set), then
    objects under the published folders that this run did not write, then every file is uploaded
    and checked (size and S3 ETag against the local MD5; unchanged objects are not sent again), the
    completion files last. Returns {uploaded, unchanged, removed, bytes}."""
    from corpusmill.stages import storage

    root = Path(root)
    files, completion = published_files(root, job)
    remote = storage.listing(url)
    ours = set(files) | set(completion)
    tops = {rel.split("/", 1)[0] for rel in ours if "/" in rel}
    stale = [rel for rel in remote if rel in completion or (rel.split("/", 1)[0] in tops and rel not in ours)]
    stale.sort(key=lambda rel: rel not in completion)  # the old manifests and ledger go first
    storage.remove([storage.join(url, rel) for rel in stale])
    counts = {"uploaded": 0, "unchanged": 0, "removed": len(stale), "bytes": 0}
    for rel in files + completion:
        local, target = root / rel, storage.join(url, rel)
        if rel not in completion and rel in remote and rel not in stale and storage.remote_matches(target, local, remote[rel]):
            counts["unchanged"] += 1
            continue
        storage.put_checked(local, target)
        counts["uploaded"] += 1
        counts["bytes"] += local.stat().st_size
    log(f"published to {url}: {counts['uploaded']} files uploaded ({counts['bytes'] / 2**20:,.1f} MiB, each checked), "
        f"{counts['unchanged']} unchanged, {counts['removed']} stale objects removed; "
        + (f"{completion[-1]} last" if completion else "no completion file"))
    return counts
