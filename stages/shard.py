"""Seeded global shuffle of packed windows into MindRecord files with equal sample counts per rank.

Every window gets its position in a seeded permutation of all windows; the remainder that does not
divide by the ranks is dropped or padded with repeats (counted), so every rank holds exactly the
same number of samples. One task per output file picks its windows, in position order, straight
out of the memory-mapped packed parts (Arrow IPC in the shared run directory), writes them with its
own `FileWriter` and counts them back through `MindDataset`:
FileWriter silently drops rows whose dtype or shape does not match. MindRecord has no checksums,
so the manifest carries a sha256 per file and a hash of the rows as meant to be written.
"""
from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from typing import Any, Iterable, Optional

import numpy as np
import xxhash

from .base import file_sha256, one_array, read_table
from .manifest import MINDRECORD_NAME  # noqa: F401 - re-exported: what mindformers' loader collects

SCHEMA_NAME = "corpusmill_pretrain"


class ShardError(RuntimeError):
    """Shards could not be written or did not read back as written."""


@dataclass
class ShardPlan:
    total_windows: int
    ranks: int
    files_per_rank: int
    per_rank: int
    dropped: int  # windows left out so that ranks are equal (remainder "drop")
    repeated: int  # windows written twice so that ranks are equal (remainder "pad")
    file_bounds: list[int]  # positions where each file starts, plus the end

    @property
    def used(self) -> int:
        return self.per_rank * self.ranks

    @property
    def files(self) -> int:
        return self.ranks * self.files_per_rank

    def file_of(self, index: int) -> tuple[int, int]:
        return divmod(index, self.files_per_rank)


def capped_files_per_rank(per_rank: int, files_per_rank: int, max_samples_per_file: int) -> int:
    """`files_per_rank`, or more when its files would hold more than `max_samples_per_file` (0: no cap)."""
    if max_samples_per_file > 0 and per_rank > files_per_rank * max_samples_per_file:
        return -(-per_rank // max_samples_per_file)
    return files_per_rank


def plan_shards(total_windows: int, ranks: int, files_per_rank: int, remainder: str = "drop",
                max_samples_per_file: int = 0, max_files_per_rank: int = 0) -> ShardPlan:
    """Equal samples per rank; files of a rank differ by at most one sample.

    The `total % ranks` windows that do not divide evenly are dropped (`drop`), or the ranks are
    filled up with copies of the first windows of the shuffled order (`pad`, as MindSpore's and
    PyTorch's distributed samplers do), so no real data is lost and no sample is made of padding.
    With `max_samples_per_file`, a rank gets more files than `files_per_rank` when its files would
    hold more: MindRecord's `FileWriter.commit` builds a file's index in memory (about 1.3 KB a
    sample), so the cap is what keeps a writer's memory flat as the corpus grows; a cap that needs
    more than `max_files_per_rank` files (0: no limit) is refused."""
    if remainder not in ("drop", "pad"):
        raise ShardError(f"unknown remainder policy {remainder!r}: use 'drop' or 'pad'")
    per_rank = total_windows // ranks if remainder == "drop" else -(-total_windows // ranks)
    if remainder == "pad" and total_windows and per_rank * ranks - total_windows > total_windows:
        raise ShardError(f"only {total_windows} samples for {ranks} ranks: padding would repeat samples more than once")
    capped = capped_files_per_rank(per_rank, files_per_rank, max_samples_per_file)
    if capped != files_per_rank and max_files_per_rank and capped > max_files_per_rank:
        # every reader opens every file: keep within open-file limits
        raise ShardError(f"{per_rank} samples per rank in files of at most {max_samples_per_file} samples would need "
                         f"{capped} files per rank, more than {max_files_per_rank}: raise "
                         "shard.max_samples_per_file or shard.ranks")
    files_per_rank = capped
    if per_rank < files_per_rank:
        raise ShardError(
            f"only {total_windows} samples for {ranks} ranks x {files_per_rank} files: every file needs at least "
            "one sample (lower shard.ranks / shard.files_per_rank or pack.seq_length, or add data)"
        )
    bounds = []
    for r in range(ranks):
        for f in range(files_per_rank):
            bounds.append(r * per_rank + (f * per_rank) // files_per_rank)
    bounds.append(ranks * per_rank)
    return ShardPlan(total_windows, ranks, files_per_rank, per_rank, max(0, total_windows - ranks * per_rank),
                     max(0, ranks * per_rank - total_windows), bounds)


def positions(total_windows: int, seed: int) -> np.ndarray:
    """inv[g] = position of window g in a seeded random permutation of all windows."""
    perm = np.random.default_rng(seed).permutation(total_windows)
    inv = np.empty(total_windows, dtype=np.int64)
    inv[perm] = np.arange(total_windows, dtype=np.int64)
    return inv


@functools.lru_cache(maxsize=1)
def _kept_positions(total_windows: int, seed: int) -> np.ndarray:
    """`positions`, kept for the next file of the same shards in this process (a writer helper writes
    a step's files one after another): with many capped files per rank, recomputing the corpus's
    permutation per file would cost more than writing it. Read-only, as it is shared."""
    inv = positions(total_windows, seed)
    inv.flags.writeable = False
    return inv


@dataclass
class Windows:
    """Packed windows with their shuffle positions: pos (n,), ids (n, window) int32, n_pad (n,)."""

    pos: np.ndarray
    ids: np.ndarray
    n_pad: np.ndarray


def count_windows(path: str) -> int:
    """Windows in one packed part (metadata only)."""
    return read_table(path, columns=["n_pad"]).num_rows


def _part_windows(path: str) -> Windows:
    """A packed part as (ids, n_pad) numpy views of its memory-mapped Arrow IPC file (positions unset)."""
    table = read_table(path, columns=["input_ids", "n_pad"])
    ids = one_array(table.column("input_ids"))
    matrix = ids.flatten().to_numpy(zero_copy_only=False).astype(np.int32, copy=False).reshape(len(ids), ids.type.list_size)
    return Windows(np.empty(0, np.int64), matrix, table.column("n_pad").to_numpy().astype(np.int32, copy=False))


def _rows_in_range(pos: np.ndarray, start: int, end: int, used: int, total: int) -> tuple[np.ndarray, np.ndarray]:
    """(rows of a part, their shuffle positions) for positions start..end-1, where positions
    `total..used-1` (remainder "pad") repeat the windows at positions `0..used-total-1`."""
    chosen = [np.flatnonzero((pos >= start) & (pos < end) & (pos < used))]
    targets = [pos[chosen[0]]]
    repeat = used - total
    if repeat > 0:
        again = np.flatnonzero((pos < repeat) & (pos + total >= start) & (pos + total < end))
        chosen.append(again)
        targets.append(pos[again] + total)
    return np.concatenate(chosen), np.concatenate(targets)


def file_rows(slices: list[np.ndarray], start: int, end: int, used: int, total: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per packed part, (its rows, their shuffle positions) among positions start..end-1, by position:
    found once per file, so each chunk of the file picks its rows by a binary search and opens only
    the parts that hold some of them."""
    found = []
    for pos in slices:
        index, at = _rows_in_range(pos, start, end, used, total)
        order = np.argsort(at, kind="stable")
        found.append((index[order], at[order]))
    return found


def gather_positions(parts: list[str], slices: list[np.ndarray], start: int, end: int, used: int, total: int,
                     window: int, found: Optional[list[tuple[np.ndarray, np.ndarray]]] = None) -> Windows:
    """The windows at shuffle positions start..end-1, in position order. `slices[i][j]` is the
    position of window j of part i. Positions `total..used-1` (remainder "pad") repeat the windows at
    positions `0..used-total-1`. `found`: `file_rows` of a range holding start..end-1 (the whole
    file's, computed once). Parts are memory-mapped Arrow IPC files, so a file's task reads only
    its own rows: the global shuffle costs one copy per window and no shuffle round."""
    found = found if found is not None else file_rows(slices, start, end, used, total)
    out = Windows(np.full(end - start, -1, np.int64), np.empty((end - start, window), np.int32),
                  np.zeros(end - start, np.int32))
    for path, (rows, at) in zip(parts, found):
        lo, hi = np.searchsorted(at, [start, end])
        if lo == hi:
            continue
        index, at = rows[lo:hi], at[lo:hi]
        part = _part_windows(path)
        if part.ids.shape[1] != window:
            raise ShardError(f"{path}: windows of {part.ids.shape[1]} ids, expected {window}")
        out.pos[at - start] = at
        out.ids[at - start] = part.ids[index]
        out.n_pad[at - start] = part.n_pad[index]
    if (out.pos != np.arange(start, end)).any():
        raise ShardError(f"positions {start}..{end - 1}: {int((out.pos < 0).sum())} have no window in the packed parts")
    return out


LAYOUTS = ("per_rank", "global")


def file_name(layout: str, rank: int, file_index: int, files_per_rank: int, ranks: int) -> str:
    """Where file `file_index` of `rank` goes.

    per_rank: a folder and a distinct file prefix per rank, names ending in `.mindrecord` (stock
    mindformers collects those under `dataset_dir`: the whole set, or one rank's folder).
    global: one prefix for the whole set, `corpus.mindrecord` + a zero-padded file number, the
    names FileWriter's own parallel writer gives; mindformers' loader collects `mindrecord\\d*$`.
    """
    if layout == "per_rank":  # numbered wide enough that names sort in file order
        return f"rank-{rank:04d}/corpus-r{rank:04d}-f{file_index:0{max(2, len(str(files_per_rank - 1)))}d}.mindrecord"
    if layout == "global":
        n = ranks * files_per_rank
        return f"corpus.mindrecord{rank * files_per_rank + file_index:0{len(str(n - 1))}d}"
    raise ShardError(f"unknown shard layout {layout!r}: use one of {', '.join(LAYOUTS)}")


def warm_up_writer() -> float:
    """Import MindSpore's MindRecord writer and reader and use both once on a one-row file (about
    2-3 s the first time in a process: the import, then the first FileWriter and MindDataset each
    initialise native state). Run once per worker before the write tasks, so that this one-off
    cost is measured apart from the writing; returns its seconds."""
    import tempfile
    import time

    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="corpusmill-warmup-") as tmp:
        path = os.path.join(tmp, "warmup.mindrecord")
        one = Windows(np.zeros(1, np.int64), np.zeros((1, 2), np.int32), np.zeros(1, np.int32))
        write_mindrecord(one, path, 2, 1000)
    return time.perf_counter() - start


def _row_digest(row: np.ndarray) -> int:
    return xxhash.xxh3_64_intdigest(np.ascontiguousarray(row, dtype=np.int32).tobytes())


IGNORE_INDEX = -100  # mindformers' label for positions that carry no loss
ACTUAL_SEQ_LEN = "actual_seq_len"  # mindformers' compressed EOD mask column (GPTDataset, the MindRecord path)


def actual_seq_len(ids: np.ndarray, eos_id: int, pad_length: int) -> np.ndarray:
    """Per sample (rows of seq_length + 1 ids), the cumulative end of each document among its first
    seq_length ids, as mindformers' GPTDataset computes it (`_get_eod_attention_mask`): the position
    after each EOS, an EOS in the last position not counted, padded with seq_length to `pad_length`
    int32 entries. ShardError for a sample with more document ends than that (mindformers refuses it)."""
    tokens = ids[:, :-1]
    seq = tokens.shape[1]
    ends = tokens == eos_id
    if seq:
        ends[:, -1] = False
    counts = ends.sum(axis=1)
    if len(counts) and int(counts.max()) > pad_length:
        raise ShardError(f"a sample holds {int(counts.max())} document ends, more than shard.eod_pad_length "
                         f"{pad_length}: raise it (mindformers' eod_pad_length must match)")
    out = np.full((len(ids), pad_length), seq, dtype=np.int32)
    rows, cols = np.nonzero(ends)
    within = np.arange(len(rows)) - np.repeat(np.cumsum(counts) - counts, counts)
    out[rows, within] = cols + 1
    return out


SHARD_CHUNK_BYTES = 16 << 20  # ids a shard task holds at a time: its memory stays flat however large the file


def write_mindrecord(chunks: Windows | Iterable[Windows], path: str, window: int, write_batch: int,
                     labels: bool = False, verify: str = "count", rows_total: Optional[int] = None,
                     eod: Optional[tuple[int, int]] = None) -> dict[str, Any]:
    """Write one file's samples (in position order), then check what MindDataset reads back:
    `count` compares the number of samples (FileWriter silently drops rows that do not match the
    schema), `full` also reads and hashes every sample. Either way the manifest gets a content hash
    of the rows as meant, so `corpusmill shards verify` can check the contents later. With
    `labels`, a `labels` column repeats the ids with IGNORE_INDEX on each sample's trailing padding.
    `chunks` may be an iterator of Windows (with `rows_total`), each a multiple of `write_batch`
    rows but the last, so a large file is written without holding it: the writer sees the same
    batches either way, and so writes the same bytes. With `eod` (eos id, pad length), an
    `actual_seq_len` column of exactly pad length int32 per sample (FileWriter drops a row of another
    shape, and the count check would say so)."""
    from mindspore.mindrecord import FileWriter  # heavy import, only where files are written

    if isinstance(chunks, Windows):
        chunks, rows_total = [chunks], len(chunks.ids)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    writer = FileWriter(path, shard_num=1, overwrite=True)
    # The default 32 MiB page and 16 MiB header would make small shards mostly padding. A page must
    # hold whole rows; the header holds one entry per page, so it only shrinks when pages are few.
    page = min(1 << 25, max(1 << 20, 4 * window * write_batch))
    writer.set_page_size(page)
    if rows_total * window * 4 // page < 1000:
        writer.set_header_size(1 << 20)
    schema = {"input_ids": {"type": "int32", "shape": [-1]}}
    if labels:
        schema["labels"] = {"type": "int32", "shape": [-1]}
    if eod is not None:
        schema[ACTUAL_SEQ_LEN] = {"type": "int32", "shape": [-1]}
    writer.add_schema(schema, SCHEMA_NAME)
    n_rows, digest_in, pad = 0, 0, 0
    for part in chunks:
        matrix = part.ids
        if matrix.shape[1:] != (window,):
            raise ShardError(f"{path}: samples hold {matrix.shape[1:]} ids, expected ({window},)")
        rows = list(matrix)  # row views, no copies
        if labels:
            masked = matrix.copy()
            masked[np.arange(window)[None, :] >= (window - part.n_pad)[:, None]] = IGNORE_INDEX
            label_rows = list(masked)
        extra: dict[str, list] = {}
        if labels:
            extra["labels"] = label_rows
        if eod is not None:
            extra[ACTUAL_SEQ_LEN] = list(actual_seq_len(matrix, *eod))
        digest_in = (digest_in + sum(_row_digest(r) for r in rows)) % (1 << 64)
        for start in range(0, len(rows), write_batch):
            end = start + write_batch
            batch = [{"input_ids": r} for r in rows[start:end]]
            for name, values in extra.items():
                for row, value in zip(batch, values[start:end]):
                    row[name] = value
            writer.write_raw_data(batch)
        n_rows += len(rows)
        pad += int(part.n_pad.sum())
    if n_rows != rows_total:
        raise ShardError(f"{path}: {n_rows} samples were gathered, {rows_total} planned")
    writer.commit()
    for f in (path, path + ".db"):
        os.chmod(f, 0o644)  # FileWriter creates 0600 files; training jobs often run as another user
    if verify == "full":
        count, digest_out = read_back(path, window)
    else:
        count, digest_out = count_samples(path), digest_in
    if count != n_rows or digest_out != digest_in:
        raise ShardError(
            f"{path}: wrote {n_rows} samples but read back {count}"
            + ("" if count != n_rows else " with different contents")
        )
    return {
        "samples": n_rows,
        "rows_xxh3_sum": digest_in,
        "tokens": int(n_rows * window - pad),
        "pad_tokens": pad,
        "sha256": file_sha256(path),
        "db_sha256": file_sha256(path + ".db"),
        "bytes": os.path.getsize(path) + os.path.getsize(path + ".db"),
    }


def gather_and_write(parts: list[str], counts: list[int], seed: int, start: int, end: int, used: int, path: str,
                     window: int, write_batch: int, labels: bool, verify: str,
                     eod: Optional[tuple[int, int]] = None) -> dict[str, Any]:
    """One output file's task: pick its windows (positions start..end-1) out of the memory-mapped
    packed parts and write them, SHARD_CHUNK_BYTES of ids at a time. The seeded permutation is
    computed here (once per process: `_kept_positions`) rather than shipped as a shared input, which
    would pull every task to the worker holding it."""
    import time

    started = time.perf_counter()
    total = int(sum(counts))
    inv = _kept_positions(total, seed)
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    slices = [inv[offsets[i]:offsets[i + 1]] for i in range(len(parts))]
    step = max(1, SHARD_CHUNK_BYTES // (4 * window * write_batch)) * write_batch
    rows = file_rows(slices, start, end, used, total)
    chunks = (gather_positions(parts, slices, a, min(a + step, end), used, total, window, rows) for a in range(start, end, step))
    out = write_mindrecord(chunks, path, window, write_batch, labels, verify, rows_total=end - start, eod=eod)
    found = file_groups(parts, rows, start)
    if found is not None:  # the file's share of the shards' composition: the driver only adds them up
        out["sample_group"], out["group_tokens"] = found
    return {**out, "task_seconds": time.perf_counter() - started}


GROUP_COLUMNS = ("group", "groups", "group_tokens")  # what the pack step adds per window (stages.pack._with_groups)


def file_groups(parts: list[str], rows: list[tuple[np.ndarray, np.ndarray]],
                start: int) -> Optional[tuple[np.ndarray, dict[int, int]]]:
    """Which (source, language) code fills each sample of a file (the one with most ids; -1 for
    none) and the ids of each code in them, from the packed parts' group columns; `rows` is the
    file's `file_rows`, whose first position is `start`. None when the parts carry no groups (packed
    in corpus order, or by an older run)."""
    sample_group = np.full(sum(len(index) for index, _ in rows), -1, np.int32)
    tokens: dict[int, int] = {}
    for path, (index, at) in zip(parts, rows):
        table = read_table(path)
        if not set(GROUP_COLUMNS) <= set(table.column_names):
            return None
        if not len(index):
            continue
        sample_group[at - start] = table.column("group").to_numpy()[index]
        groups, group_tokens = one_array(table.column("groups")), one_array(table.column("group_tokens"))
        offsets = groups.offsets.to_numpy()
        codes, ids = groups.values.to_numpy(), group_tokens.values.to_numpy()
        counts = offsets[index + 1] - offsets[index]
        pieces = np.repeat(offsets[index], counts) + (np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts))
        if len(pieces):
            code = codes[pieces].astype(np.int64)
            summed = np.zeros(int(code.max()) + 1, np.int64)
            np.add.at(summed, code, ids[pieces].astype(np.int64))
            for c in np.flatnonzero(summed):
                tokens[int(c)] = tokens.get(int(c), 0) + int(summed[c])
    return sample_group, tokens


def count_samples(path: str) -> int:
    """Samples in one MindRecord file, as MindDataset sees them (from its index and header)."""
    import mindspore.dataset as ds

    return ds.MindDataset([path], columns_list=["input_ids"], shuffle=False).get_dataset_size()


def read_back(path: str, window: int) -> tuple[int, int]:
    """Count and hash every sample of one MindRecord file through `MindDataset`."""
    count, digest = _read_all(path, window)[:2]
    return count, digest


EOD_OUTPUT_COLUMNS = ["input_ids", "position_ids", "attention_mask"]  # what mindformers' EOD-reset map makes


def mindformers_snippet(shards_dir: str, layout: str, sample_length: int, columns: list[str],
                        eod_token_id: Optional[int], workers: Optional[int] = None,
                        eod_pad_length: Optional[int] = None) -> str:
    """A `train_dataset` section stock mindformers reads as it is (its MindDataset loader collects
    the MindRecord files under `dataset_dir` and splits their samples with num_shards = data
    parallel, shard_id = rank). With EOD reset, mindformers' CausalLanguageModelDataset maps
    `input_ids` alone to (input_ids, position_ids, attention_mask) and projects `output_columns`,
    so both must be given as its own configs do: without them it stops with a TypeError.
    MindSpore refuses more parallel workers than the host has CPUs, so the default is this host's
    count, at most 8."""
    import json

    workers = workers or max(1, min(8, os.cpu_count() or 1))
    if eod_pad_length is not None:
        return _compressed_eod_snippet(shards_dir, layout, sample_length, columns, eod_pad_length, workers)
    if eod_token_id is None:
        eod, inputs = "", columns
    else:
        inputs = ["input_ids"]
        eod = (f"  output_columns: {json.dumps(EOD_OUTPUT_COLUMNS)}\n"
               f"  eod_reset: True  # documents are packed together: reset attention and positions at EOS\n"
               f"  eod_token_id: {eod_token_id}\n")
    note = ""
    if eod_token_id is not None and "labels" in columns:
        note = ("# The files also hold `labels` (-100 on trailing padding); mindformers' EOD-reset map takes\n"
                "# input_ids only, so set the model's pad_token_id to manifest.json's tokenizer.pad_id to keep\n"
                "# padding out of the loss (or set eod_reset: False and input_columns: [input_ids, labels]).\n")
    where = (f"# For one rank's files only, point dataset_dir at {shards_dir}/rank-NNNN." if layout == "per_rank" else
             "# Files are corpus.mindrecordNN, each with its own header (as FileWriter's parallel writer makes\n"
             "# them): give MindDataset the list of files (dataset_dir does), not one file name.")
    return f"""# Paste into a mindformers pretraining YAML. Samples are `input_ids` of {sample_length} int32
# (seq_length + 1). num_parallel_workers must not exceed the training host's CPU count.
{where}
{note}train_dataset: &train_dataset
  data_loader:
    type: MindDataset
    dataset_dir: "{shards_dir}"
    shuffle: True
  input_columns: {json.dumps(inputs)}
{eod}"""+_loader_tail(workers)


def _loader_tail(workers: int) -> str:
    """The end every train_dataset section shares: the loader's settings and the dataset task."""
    return f"""  num_parallel_workers: {workers}
  python_multiprocessing: False
  drop_remainder: True
  batch_size: 1
  repeat: 1
  numa_enable: False
  prefetch_size: 1
train_dataset_task:
  type: CausalLanguageModelDataset
  dataset_config: *train_dataset
"""


def _compressed_eod_snippet(shards_dir: str, layout: str, sample_length: int, columns: list[str], eod_pad_length: int,
                            workers: int) -> str:
    """The `train_dataset` section for shards with an actual_seq_len column: MindDataset yields it as
    stored (no seq_length x seq_length mask is built on the host), for a model with
    use_eod_attn_mask_compression. mindformers adds the per-batch offsets to actual_seq_len only for
    loaders that build it themselves, so the section reads one sample per batch."""
    import json

    inputs = [c for c in columns if c != ACTUAL_SEQ_LEN] + [ACTUAL_SEQ_LEN]  # mindformers wants it last
    where = f"{shards_dir}/rank-NNNN" if layout == "per_rank" else "the list of corpus.mindrecordNN files"
    return f"""# Paste into a mindformers pretraining YAML. Samples are `input_ids` of {sample_length} int32
# (seq_length + 1) and `actual_seq_len` of {eod_pad_length} int32: the cumulative end of each packed document
# among the first seq_length ids (mindformers' compressed EOD mask, eod_pad_length {eod_pad_length}), so set
# model_config.use_eod_attn_mask_compression: True. Its values are per sample: keep batch_size 1 here.
# For one rank's files only, point dataset_dir at {where}.
train_dataset: &train_dataset
  data_loader:
    type: MindDataset
    dataset_dir: "{shards_dir}"
    shuffle: True
  input_columns: {json.dumps(inputs)}
  eod_reset: False  # the compressed mask replaces the full mask eod_reset would build
"""+_loader_tail(workers)


def verify_shard_dir(shards_dir: str) -> tuple[list[str], dict]:
    """Check a shard directory against everything its manifest claims (see stages.manifest): the
    manifest itself, paths inside the folder, sizes and sha256 of every `.mindrecord`, `.db` and the
    tokenizer, the tokenizer's vocabulary and special ids, each file's header and index naming each
    other, ranks against files, unlisted MindRecord files. Only when all of that holds is every
    sample read back through MindDataset (count, length, dtype, content hash, ids in the
    vocabulary), in a child process, so that a file that crashes MindSpore's reader is a finding
    and not a crash. Returns (problems, totals); never raises for damaged input."""
    from . import manifest as mf

    root = os.path.abspath(shards_dir)
    manifest, problems = mf.parse(root)
    if manifest is None:
        return problems, {}
    problems = mf.check(root, manifest)
    ranks, vocab, window = manifest["ranks"], manifest["vocab_size"], manifest["sample_length"]
    totals: dict[str, Any] = {"files": len(manifest["files"]), "ranks": ranks, "vocab_size": vocab, "rows_checked": False}
    mega = manifest.get("megatron")
    if mega is not None:  # its pairs were read in full by mf.check (stages.megatron.pair_problems)
        totals.update(megatron_pairs=len(mega["pairs"]), megatron_documents=sum(p["documents"] for p in mega["pairs"]),
                      megatron_tokens=sum(p["tokens"] for p in mega["pairs"]))
    if problems:
        return problems, totals  # damaged or inconsistent: no file goes to MindSpore's reader
    if not manifest["files"]:
        totals.update(samples=0, samples_per_rank={}, max_token_id=max(p.get("max_id", -1) for p in mega["pairs"]),
                      rows_checked=True)
        return problems, totals
    layout = manifest.get("layout", "per_rank")
    files = [(e["path"], os.path.join(root, e["path"])) for e in manifest["files"]]
    size = sum(e["bytes"] for e in manifest["files"])
    eod, why = _eod_claim(manifest.get("eod_metadata"), vocab)
    if why:
        return [f"manifest.json: eod_metadata {why}"], totals
    results = read_rows_isolated(files, window, ranks if layout == "global" else None, timeout=300 + size / (1 << 20),
                                 eod=eod)
    per_rank: dict[int, int] = {}
    max_id = -1
    for entry in manifest["files"]:
        rel = entry["path"]
        got = results.get(rel, {"error": "MindSpore's reader gave no result for it"})
        if "error" in got:
            problems.append(f"{rel}: cannot be read back: {got['error']}")
            continue
        count, digest, top, low = got["count"], got["digest"], got["top"], got["low"]
        if count != entry["samples"]:
            problems.append(f"{rel}: {count} samples read back, manifest says {entry['samples']}")
        elif "rows_xxh3_sum" in entry and digest != entry["rows_xxh3_sum"]:
            problems.append(f"{rel}: sample contents differ from what was written")
        if top >= vocab or low < 0:
            problems.append(f"{rel}: token ids {low}..{top} are not all within the vocabulary (0..{vocab - 1})")
        if got.get("eod_bad") and got["eod_bad"][0]:
            problems.append(f"{rel}: actual_seq_len of {got['eod_bad'][0]:,} samples is not their ids' document ends "
                            f"(first: sample {got['eod_bad'][1]}): attention would cross documents")
        max_id = max(max_id, top)
        if entry["rank"] is not None:
            per_rank[entry["rank"]] = per_rank.get(entry["rank"], 0) + count
    expected = manifest["samples_per_rank"]
    if layout == "per_rank":
        for rank in range(ranks):
            if per_rank.get(rank, 0) != expected and not any(f"rank-{rank:04d}/" in p for p in problems):
                problems.append(f"rank {rank}: {per_rank.get(rank, 0)} samples, expected {expected}")
    elif "global_ranks" in results:
        # global: the ranks are MindDataset's own split of the file list (num_shards, shard_id)
        per_rank = {int(r): n for r, n in results["global_ranks"]["sizes"].items()}
        if set(per_rank.values()) != {expected}:
            problems.append(f"MindDataset(num_shards={ranks}) gives ranks {per_rank} samples, expected {expected} each")
    elif not problems:
        problems.append(f"MindDataset(num_shards={ranks}) could not split the files: {results.get('_split_error', '?')}")
    totals.update(samples=sum(per_rank.values()), samples_per_rank=per_rank, max_token_id=max_id,
                  rows_checked=True)
    return problems, totals


def _eod_claim(meta: Any, vocab: int) -> tuple[Optional[tuple[int, int]], Optional[str]]:
    """(eos id, pad length) of a manifest's eod_metadata, or None when it has none; or why it is unusable."""
    if meta is None:
        return None, None
    ok = isinstance(meta, dict) and all(isinstance(meta.get(k), int) and not isinstance(meta.get(k), bool)
                                        for k in ("eos_id", "eod_pad_length"))
    if not ok or not 0 <= meta["eos_id"] < vocab or not 1 <= meta["eod_pad_length"] <= 1 << 16:
        return None, ("must be {column: actual_seq_len, eos_id: an id of the vocabulary, eod_pad_length: 1..65536}, "
                      f"not {str(meta)[:120]}")
    return (meta["eos_id"], meta["eod_pad_length"]), None


_ROW_MARK = "corpusmill-rows "
_ROW_CHILD = "from corpusmill.stages.shard import _row_child; _row_child()"


def _row_child() -> None:
    """In a child process: read back each file named on stdin, one marked JSON line per file on
    stdout ({"start": rel} first, so the parent knows which file a crash happened in)."""
    import json
    import sys

    job = json.loads(sys.stdin.read())

    def say(obj: dict) -> None:
        sys.stdout.write(_ROW_MARK + json.dumps(obj) + "\n")
        sys.stdout.flush()

    for rel, path in job["files"]:
        say({"start": rel})
        try:
            count, digest, top, low, eod_bad = _read_all(path, job["window"], job.get("eod"))
            say({"rel": rel, "count": count, "digest": digest, "top": top, "low": low, "eod_bad": eod_bad})
        except Exception as e:  # noqa: BLE001 - MindSpore's C++ reader raises RuntimeError with pages of text
            say({"rel": rel, "error": (str(e).splitlines() or [type(e).__name__])[0][:200]})
    if job.get("global_ranks"):
        say({"start": "_global_split"})
        try:
            sizes = global_rank_sizes([p for _, p in job["files"]], job["global_ranks"])
            say({"rel": "global_ranks", "sizes": sizes})
        except Exception as e:  # noqa: BLE001
            say({"rel": "_split_error", "error": (str(e).splitlines() or ["?"])[0][:200]})
    os._exit(0)  # skip MindSpore's interpreter teardown: the results are out


def read_rows_isolated(files: list[tuple[str, str]], window: int, global_ranks: Optional[int] = None,
                       timeout: float = 600.0, eod: Optional[tuple[int, int]] = None) -> dict[str, dict]:
    """Read back every (name, path) through MindDataset in a child Python process (a fresh
    interpreter: a process that forks after MindSpore use can deadlock). A child that crashes
    (SIGSEGV, abort) or hangs is reported against the file it was reading, and a new child goes on
    with the files after it. With `eod` (eos id, pad length) each sample's actual_seq_len column is
    checked against its ids. Returns name -> {count, digest, top, low, eod_bad} or {error}."""
    import json
    import signal
    import subprocess
    import sys

    env = {**os.environ, "GLOG_v": os.environ.get("GLOG_v", "3")}  # the installed package, as the parent imports it
    results: dict[str, dict] = {}
    pending, want_split = list(files), global_ranks is not None
    while True:
        job = {"files": [list(f) for f in pending], "window": window, "global_ranks": global_ranks if want_split else None,
               "eod": list(eod) if eod is not None else None}
        try:
            proc = subprocess.run([sys.executable, "-c", _ROW_CHILD], input=json.dumps(job), capture_output=True,
                                  text=True, errors="replace", timeout=timeout, env=env)
            out, why = proc.stdout, None
            if proc.returncode < 0:
                why = f"MindSpore's reader crashed on it (killed by {signal.Signals(-proc.returncode).name})"
            elif proc.returncode:
                why = f"MindSpore's reader exited with code {proc.returncode}"
        except subprocess.TimeoutExpired as e:
            out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
            why = f"MindSpore's reader did not finish within {timeout:.0f} s"
        started: Optional[str] = None
        for line in out.splitlines():
            if line.startswith(_ROW_MARK):
                msg = json.loads(line[len(_ROW_MARK):])
                started = msg["start"] if "start" in msg else None
                if "rel" in msg:
                    results[msg["rel"]] = msg
        if not why:
            for rel, _ in pending:
                results.setdefault(rel, {"error": "MindSpore's reader gave no result for it"})
            break
        culprit = started or next((rel for rel, _ in pending if rel not in results), None) or \
            ("_global_split" if want_split else None)
        if culprit is None:
            break  # it died after reporting everything
        results["_split_error" if culprit == "_global_split" else culprit] = {"error": why}
        pending = [f for f in pending if f[0] not in results]
        want_split = want_split and "global_ranks" not in results and "_split_error" not in results
        if not pending and not want_split:
            break
    return results


def global_rank_sizes(files: list[str], ranks: int) -> dict[int, int]:
    """Samples per rank when MindDataset splits these files with num_shards=ranks."""
    import mindspore.dataset as ds

    return {r: ds.MindDataset(files, columns_list=["input_ids"], num_shards=ranks, shard_id=r, shuffle=False)
            .get_dataset_size() for r in range(ranks)}


def _read_all(path: str, window: int, eod: Optional[list[int]] = None) -> tuple[int, int, int, int, Optional[list[int]]]:
    """(samples, content hash, largest id, smallest id, eod_bad) of one file, every sample read
    through MindDataset; ShardError on a sample that is not `window` int32 ids. With `eod` (eos id,
    pad length), eod_bad is [samples whose actual_seq_len is not their ids' document ends, the first
    such sample] (the column is what mindformers masks attention by: a wrong one trains silently)."""
    import mindspore.dataset as ds

    columns = ["input_ids"] + ([ACTUAL_SEQ_LEN] if eod else [])
    data = ds.MindDataset([path], columns_list=columns, shuffle=False, num_parallel_workers=1)
    count, digest, top, low, bad, first = 0, 0, -1, 0, 0, -1
    for row in data.batch(1024).create_tuple_iterator(output_numpy=True, num_epochs=1):
        batch = row[0]
        if batch.ndim != 2 or batch.shape[1] != window or batch.dtype != np.int32:
            raise ShardError(f"samples of shape {batch.shape[1:]} {batch.dtype}, expected ({window},) int32")
        if eod:
            asl = row[1]
            if asl.ndim != 2 or asl.shape[1] != eod[1] or asl.dtype != np.int32:
                raise ShardError(f"actual_seq_len of shape {asl.shape[1:]} {asl.dtype}, expected ({eod[1]},) int32")
            try:
                wrong = (asl != actual_seq_len(batch, eod[0], eod[1])).any(axis=1)
            except ShardError:  # more document ends than the pad length holds: no column could be right
                wrong = np.ones(len(batch), bool)
            if wrong.any() and first < 0:
                first = count + int(np.argmax(wrong))
            bad += int(wrong.sum())
        count += len(batch)
        digest = (digest + sum(_row_digest(r) for r in batch)) % (1 << 64)
        top = max(top, int(batch.max()))
        low = min(low, int(batch.min()))
    return count, digest, top, low, ([bad, first] if eod else None)
