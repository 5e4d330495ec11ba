"""Shard manifest checks and the per-rank MindDataset reader."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Optional


class ShardMismatch(ValueError):
    """The shards do not fit the model (sequence length, vocabulary) or are incomplete."""


def load_manifest(shards_dir: str) -> dict[str, Any]:
    path = Path(shards_dir) / "manifest.json"
    if not path.is_file():
        raise ShardMismatch(f"{path} does not exist: not a finished corpusmill shard directory")
    manifest = json.loads(path.read_text(encoding="utf-8"))
    for entry in manifest["files"]:
        f = Path(shards_dir) / entry["path"]
        if not f.is_file() or not Path(str(f) + ".db").is_file():
            raise ShardMismatch(f"shard file {f} (or its .db) listed in {path} is missing")
    return manifest


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
