"""Shard checks before training and the per-rank MindDataset reader."""
from __future__ import annotations

import os
import time
from typing import Any, Callable, Optional

from corpusmill.stages import manifest as mf
from corpusmill.stages.manifest import ShardMismatch  # noqa: F401 - raised by the checks here; cli.main prints it as one line


def local_shards(shards: str, log: Callable[[str], None] = print) -> str:
    """A shard folder MindDataset can open: `shards` itself when local; for a URL (s3://...), its
    local copy in the cache (`storage.mirror`: only objects whose size or ETag changed are fetched
    again). The copy is then checked against its manifest like any local folder."""
    from corpusmill.stages import storage

    if not storage.is_url(shards):
        return shards
    return str(storage.mirror(shards, log=log))


def remote_sibling(shards_url: str, name: str, log: Callable[[str], None] = print) -> Optional[str]:
    """The local copy of the folder `name` beside a shard URL (its held-out set, shards-validation/),
    when it holds a manifest; else None."""
    from corpusmill.stages import storage

    parent = shards_url.rstrip("/").rsplit("/", 1)[0]
    url = storage.join(parent, name)
    if "manifest.json" not in storage.listing(url):
        return None
    return str(storage.mirror(url, log=log))


def load_manifest(shards_dir: str) -> dict[str, Any]:
    """The shard folder's manifest, refused (ShardMismatch, one line) when it is damaged, disagrees
    with itself, or lists a file that is missing or outside the folder. Reads no file contents."""
    manifest = mf.load(shards_dir)
    problems = mf.layout_problems(shards_dir, manifest)
    if problems:
        raise ShardMismatch(mf.summary_line(shards_dir, problems) + VERIFY_HINT.format(dir=shards_dir))
    return manifest


VERIFY_HINT = "; `corpusmill shards verify {dir}` lists every problem"


def check_shards(shards_dir: str, verify: bool = True, log: Callable[[str], None] = print,
                 need_mindrecord: bool = True) -> dict[str, Any]:
    """What training checks before it starts: the manifest and the layout always; with `verify`, also
    the size and sha256 of every file, the tokenizer against the manifest, each file's header and
    index, and the first sample's length. One ShardMismatch line for whatever does not check out.
    Shards of Megatron pairs only (shard.format megatron) are refused unless `need_mindrecord` is off."""
    manifest = load_manifest(shards_dir)
    if not manifest["files"] and need_mindrecord:
        raise ShardMismatch(f"shards in {shards_dir} hold Megatron .bin/.idx pairs only: training here reads MindRecord "
                            "(write them with shard.format mindrecord or both; the pairs are for mindformers' "
                            "BlendedMegatronDatasetDataLoader)")
    if not verify:
        log("train: --no-verify: shard checksums, tokenizer and indexes not checked")
        return manifest
    started = time.perf_counter()
    problems = mf.content_problems(shards_dir, manifest)
    if problems:
        raise ShardMismatch(mf.summary_line(shards_dir, problems) + VERIFY_HINT.format(dir=shards_dir)
                            + " (--no-verify trains anyway)")
    seconds = time.perf_counter() - started
    if not manifest["files"]:
        return manifest
    first = manifest["files"][0]
    length = _first_sample_length(os.path.join(shards_dir, first["path"]))
    if length != manifest["sample_length"]:
        raise ShardMismatch(f"shards in {shards_dir} do not check out: {first['path']} holds samples of {length} ids, "
                            f"the manifest says sample_length {manifest['sample_length']} (seq_length + 1)")
    size = sum(e["bytes"] for e in manifest["files"])
    log(f"train: shards checked against the manifest: {len(manifest['files'])} files, {size / 1e6:.1f} MB sha256 "
        f"in {seconds:.2f} s, tokenizer, indexes and sample length match")
    return manifest


def _first_sample_length(path: str) -> int:
    """Ids in the first sample of a file (only called once its sha256 and index have checked out)."""
    import mindspore.dataset as ds

    data = ds.MindDataset([path], columns_list=["input_ids"], shuffle=False, num_parallel_workers=1, num_samples=1)
    rows = [row for (row,) in data.create_tuple_iterator(output_numpy=True, num_epochs=1)]  # run to its end
    return (int(rows[0].shape[0]) if rows[0].ndim == 1 else -1) if rows else 0


def check_model_fits(manifest: dict[str, Any], seq_length: Optional[int], vocab_size: Optional[int]) -> tuple[int, int]:
    """The model's (seq_length, vocab_size), filled from the manifest where not given; refuses a mismatch."""
    m_seq, m_vocab = manifest["seq_length"], manifest["vocab_size"]
    if seq_length is not None and seq_length != m_seq:
        raise ShardMismatch(
            f"shards hold samples of seq_length {m_seq} (+1) but the model's seq_length is {seq_length}; "
            "repack the corpus or change train.model.seq_length"
        )
    if vocab_size is not None and vocab_size < m_vocab:
        raise ShardMismatch(
            f"shards were tokenized with a vocabulary of {m_vocab} ids but the model has only {vocab_size} "
            "embedding rows; ids past the embedding would corrupt training"
        )
    return m_seq, vocab_size or m_vocab


def rank_files(manifest: dict[str, Any], shards_dir: str, rank: int) -> tuple[list[str], dict[str, int]]:
    """The files rank `rank` opens and the MindDataset sharding arguments it passes.

    per_rank: only the rank's own files, no further split. global: every file of the set, split
    by MindDataset itself with num_shards = ranks, shard_id = rank (as stock mindformers does)."""
    ranks = manifest["ranks"]
    if not 0 <= rank < ranks:
        raise ShardMismatch(f"rank {rank} does not exist: the shards were written for {ranks} ranks")
    if manifest.get("layout", "per_rank") == "global":
        return [os.path.join(shards_dir, e["path"]) for e in manifest["files"]], {"num_shards": ranks, "shard_id": rank}
    return [os.path.join(shards_dir, e["path"]) for e in manifest["files"] if e["rank"] == rank], {}


def rank_dataset(files: list[str], sharding: dict[str, int], batch_size: int, num_parallel_workers: int,
                 shuffle: bool, seed: int):
    """Batches of `input_ids` from one rank's share (a list of files, never a single prefix)."""
    import mindspore.dataset as ds

    cpus = os.cpu_count() or 1
    if num_parallel_workers > cpus:
        raise ShardMismatch(f"num_parallel_workers {num_parallel_workers} exceeds the {cpus} CPUs (MindSpore refuses)")
    ds.config.set_seed(seed)
    data = ds.MindDataset(files, columns_list=["input_ids"], shuffle=shuffle, num_parallel_workers=num_parallel_workers,
                          **sharding)
    return data.batch(batch_size, drop_remainder=True)
