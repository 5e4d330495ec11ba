"""The document ledger: every input document ends kept, filtered, a duplicate, or quarantined.

The pipeline checks the balance itself, per stage and overall, and refuses to finish a run whose
counts do not add up.

`lost_input` is apart from that balance: the unreadable rest of a damaged file (a truncated or
corrupt .gz / .zst stream, a Parquet file without a readable footer) holds an unknown number of
documents, so it is counted in files and bytes (`bytes`: file bytes after the damage that could not
be decoded; `partial_bytes`: decoded bytes of an incomplete record cut off by it), never as
documents. A Parquet row group that cannot be decoded has a known row count: its rows are
quarantined documents (one quarantine row with `rows`), inside the balance.
"""
from __future__ import annotations

from typing import Any

FILTERED, DUPLICATES, QUARANTINED = "filtered", "duplicates", "quarantined"  # what a document step's removals are


class LedgerError(RuntimeError):
    """Documents were lost or double-counted between stages."""


def _removed_total(stage: dict) -> int:
    return int(sum((stage.get("removed") or {}).values()))


def build_ledger(stats: dict[str, dict], doc_stages: dict[str, str]) -> dict[str, Any]:
    """Counts per stage and overall, with `input == kept + filtered + duplicates + quarantined` checked.
    `doc_stages`: the document steps in order, each with what its removals count as (the first, the
    reader, quarantines)."""
    problems = []
    previous_out = None
    stages: dict[str, Any] = {}
    for name in doc_stages:
        s = stats[name]
        docs_in, docs_out, removed = s["docs_in"], s["docs_out"], _removed_total(s)
        if docs_in != docs_out + removed:
            problems.append(f"stage {name}: {docs_in} in != {docs_out} out + {removed} removed")
        if previous_out is not None and docs_in != previous_out:
            problems.append(f"stage {name} received {docs_in} documents but the stage before passed on {previous_out}")
        previous_out = docs_out
        stages[name] = {"in": docs_in, "out": docs_out, "removed": dict(s.get("removed") or {})}
    read = stats["read"]
    ledger: dict[str, Any] = {
        "input": int(read["docs_in"]),
        "kept": int(stats[list(doc_stages)[-1]]["docs_out"]),
        "filtered": sum(_removed_total(stats[n]) for n, kind in doc_stages.items() if kind == FILTERED),
        "duplicates": sum(_removed_total(stats[n]) for n, kind in doc_stages.items() if kind == DUPLICATES),
        "quarantined": int(read["quarantined"]),
    }
    total = ledger["kept"] + ledger["filtered"] + ledger["duplicates"] + ledger["quarantined"]
    if ledger["input"] != total:
        problems.append(
            f"input {ledger['input']} != kept {ledger['kept']} + filtered {ledger['filtered']} + "
            f"duplicates {ledger['duplicates']} + quarantined {ledger['quarantined']} (= {total})"
        )
    if problems:
        raise LedgerError("the document ledger does not add up: " + "; ".join(problems))
    ledger["balanced"] = True
    lost = read.get("lost_input") or {}
    ledger["lost_input"] = {k: int(lost.get(k, 0)) for k in ("files", "bytes", "partial_bytes")}
    ledger["blank_lines_skipped"] = int(read.get("blank_lines", 0))
    ledger["stages"] = stages
    if "pii" in stats:  # personal data: matches and documents per kind, what was done with them
        p = stats["pii"]
        ledger["pii"] = {"matches": dict(p.get("pii_matches") or {}), "documents": dict(p.get("pii_docs") or {}),
                         "actions": dict(p.get("actions") or {}), "docs_changed": int(p.get("docs_changed", 0)),
                         "docs_dropped": int((p.get("removed") or {}).get("pii", 0))}
    blocked = (stats.get("filter") or {}).get("blocked_words")
    if blocked:  # which list decided reason blocked_words
        ledger["blocked_words"] = dict(blocked)
    if "normalize" in stats and stats["normalize"].get("chinese_convert"):
        ledger["chinese_convert"] = {"conversion": stats["normalize"]["chinese_convert"],
                                     "docs_converted": int(stats["normalize"].get("docs_converted", 0))}
    if "tokenize" in stats:
        ledger["tokens"] = int(stats["tokenize"]["tokens"])
    if "pack" in stats:
        p = stats["pack"]
        ledger["packing"] = {k: int(p[k]) for k in ("tokens_in", "tokens_kept", "windows", "docs_split", "docs_truncated",
                                                     "tokens_dropped", "pad_tokens")}
        ledger["packing"].update(mode=p["mode"], padding_share=round(float(p["padding_share"]), 6))
    shard_stats = stats.get("shard") or {}
    held_out = (stats.get("pack") or {}).get("validation")
    if held_out is None and "pack" not in stats:  # shard.format megatron: the shard step split and mixed
        held_out = shard_stats.get("held_out")
    if held_out is not None:  # kept documents held out for validation (split.validation): packed and sharded apart
        written = shard_stats.get("validation") or {}
        ledger["validation"] = {"documents": int(held_out.get("docs_in", 0)), "tokens": int(held_out.get("tokens_in", 0)),
                                "windows": int(held_out.get("windows", 0)), "samples": int(written.get("samples", 0)),
                                "megatron_documents": int(written.get("megatron_documents", 0)),
                                "megatron_pairs": int(written.get("megatron_pairs", 0))}
    mix = (stats.get("pack") or {}).get("mix") if "pack" in stats else shard_stats.get("mix")
    packed = int(stats["pack"]["docs_in"]) if "pack" in stats else int(shard_stats.get("megatron_documents", 0))
    rehydrate = (stats.get("pack") or {}).get("rehydrate") if "pack" in stats else shard_stats.get("rehydrate")
    expected = int(stats["tokenize"]["docs_in"]) - int((held_out or {}).get("docs_in", 0)) if "tokenize" in stats else 0
    if rehydrate is not None:  # pack.rehydrate: every training document once, plus its cluster's repeated copies
        if rehydrate["documents"] != expected or (mix is None and packed != expected + rehydrate["repeated_copies"]):
            raise LedgerError(f"rehydration does not add up: {expected} training documents, {rehydrate['documents']} "
                              f"weighed, {rehydrate['repeated_copies']} repeated copies; {packed} packed")
        ledger["rehydrate"] = rehydrate
        expected += int(rehydrate["repeated_copies"])  # the mixture draws from the upsampled pool
    if mix is not None:  # mix: every kept document drawn (once or more) or left out, each copy counted
        m = mix
        if not (m["documents"] == expected == m["documents_drawn"] + m["documents_left_out"]
                and m["copies"] == m["documents_drawn"] + m["repeated_copies"] == packed):
            raise LedgerError(f"the mixture does not add up: {expected} documents to mix, {m['documents']} mixed = "
                              f"{m['documents_drawn']} drawn + {m['documents_left_out']} left out; {m['copies']} copies = "
                              f"drawn + {m['repeated_copies']} repeated; {packed} packed")
        ledger["mix"] = mix
    if "shard" in stats:
        ledger["samples"] = int(stats["shard"]["samples"])
        ledger["samples_per_rank"] = int(stats["shard"]["samples_per_rank"])
        ledger["samples_dropped_for_equal_ranks"] = int(stats["shard"]["dropped_samples"])
        ledger["shard_bytes"] = int(stats["shard"]["bytes"])
        if "megatron_pairs" in stats["shard"]:
            ledger["megatron"] = {k: stats["shard"][f"megatron_{k}"] for k in ("pairs", "documents", "tokens")}
    return ledger


def project_full_run(ledger: dict[str, Any], stats: dict[str, dict], fraction: float, seed: int,
                     n_workers: int) -> dict[str, Any]:
    """What the full run would give, from a run on a seeded `fraction` of the documents.

    Counts scale by 1 / fraction; the number of input records is exact (the reader counts the ones
    it skips). A duplicate pair is seen only when both copies are sampled, so duplicates scale by
    1 / fraction^2 (exact for pairs; larger clusters are a little over-counted) and kept, tokens and
    samples shrink by the copies that would be removed. A stage's time splits into work that scales (its tasks' compute seconds over the
    workers) and a fixed part (the rest: scheduling, tokenizer training on a fixed-size sample,
    start-up), which does not."""
    scale = 1.0 / fraction
    read = stats["read"]
    projected: dict[str, Any] = {
        "input": int(read["docs_in"]) + int(read.get("not_sampled", 0)),
        **{k: round(ledger[k] * scale) for k in ("kept", "filtered", "duplicates", "quarantined")},
    }
    # a duplicate pair is seen only when both copies are sampled (fraction^2 of the pairs), while a pair
    # with one copy sampled keeps it: for pairs, the full run removes duplicates / fraction^2, and
    # kept (and what is made of it: tokens, samples) shrinks by the difference
    dups = ledger["duplicates"]
    kept_full = max(0.0, ledger["kept"] * scale - dups * (scale * scale - scale))
    shrink = kept_full / (ledger["kept"] * scale) if ledger["kept"] else 1.0
    projected["duplicates"] = round(dups * scale * scale)
    projected["kept"] = round(kept_full)
    for key in ("tokens", "samples", "samples_per_rank"):
        if key in ledger:
            projected[key] = round(ledger[key] * scale * shrink)
    if "shard" in stats:
        # a MindRecord file is its samples plus a header and index that do not grow with them
        sh = stats["shard"]
        payload = int(sh.get("payload_bytes_per_sample", 0)) * int(sh["samples"])
        projected["shard_bytes"] = round(payload * scale * shrink + max(0, int(sh["bytes"]) - payload))
    wall = 0.0
    for name, seconds in (ledger.get("run", {}).get("seconds_per_stage") or {}).items():
        task_s = float(stats.get(name, {}).get("task_seconds", 0.0))
        variable = min(seconds, task_s / max(1, n_workers)) if task_s else seconds
        wall += (seconds - variable) + variable * scale
    projected["wall_s"] = round(wall, 1)
    return {
        "fraction": fraction,
        "seed": seed,
        "documents_not_sampled": int(read.get("not_sampled", 0)),
        "projected_full_run": projected,
        "note": "counts scale by 1/fraction; duplicates by 1/fraction^2 (a pair is seen only when both copies "
                "are sampled), kept, tokens and samples less the copies that would be removed; wall time scales "
                "only the stages' task compute",
    }
