"""Which documents go where before packing: the held-out validation split, and the mixture.

The split is decided per document by a seeded hash of its text (`doc_hash`, written by the tokenize
step), never by its position: the same text falls on the same side in every run, whatever file or
line it came from, and adding documents moves none of the others.
"""
from __future__ import annotations

from typing import Optional

import numpy as np

_GOLDEN = 0x9E3779B97F4A7C15


def mix64(x: np.ndarray) -> np.ndarray:
    """MurmurHash3's 64-bit finaliser (an avalanching bijection), element-wise on uint64."""
    with np.errstate(over="ignore"):
        x = x ^ (x >> np.uint64(33))
        x = x * np.uint64(0xFF51AFD7ED558CCD)
        x = x ^ (x >> np.uint64(33))
        x = x * np.uint64(0xC4CEB9FE1A85EC53)
        return x ^ (x >> np.uint64(33))


def seeded_unit(doc_hash: np.ndarray, seed: int, salt: int = 0) -> np.ndarray:
    """A uniform number in [0, 1) per document from its text hash and a seed (and a salt, so the
    split and the mixture's draws are independent)."""
    key = np.uint64((seed * _GOLDEN + salt * 0xBF58476D1CE4E5B9) & ((1 << 64) - 1))
    mixed = mix64(np.asarray(doc_hash, np.uint64) ^ mix64(np.full(1, key, np.uint64))[0])
    return (mixed >> np.uint64(11)).astype(np.float64) / float(1 << 53)


def validation_mask(doc_hash: np.ndarray, fraction: float, seed: int) -> np.ndarray:
    """True for the documents held out for validation: a seeded hash of the text below `fraction`."""
    if fraction <= 0:
        return np.zeros(len(doc_hash), bool)
    return seeded_unit(doc_hash, seed, salt=1) < fraction


# ---- the mixture ----------------------------------------------------------------------------------

FIXED = ("tokens", "epochs")


def rule_kind(rule: dict) -> str:
    return next(k for k in ("weight", "tokens", "epochs") if rule.get(k) is not None)


def match_rules(pairs: list[tuple[str, str]], codes: np.ndarray, files: np.ndarray, paths: list[str],
                rules: list[dict], buckets: Optional[tuple[list[str], np.ndarray]] = None) -> tuple[np.ndarray, np.ndarray]:
    """Per document: the first rule it matches (its owner; -1: none, the rest), and the weighted rule
    its tokens count toward (its owner when weighted; for a document of an epochs/tokens rule, the
    first weighted rule it also matches; -1: none). `codes` index `pairs` ((source, language));
    `files` index `paths` (the input files); `buckets`: (names, each document's quality_bucket as an
    index into them, -1: none), for rules matching by quality_bucket (stages.classifier.part_buckets)."""
    import fnmatch

    n = len(codes)
    owner = np.full(n, -1, np.int64)
    home = np.full(n, -1, np.int64)
    for r, rule in enumerate(rules):
        ok_code = np.ones(len(pairs), bool)
        if rule.get("source"):
            ok_code &= np.array([any(fnmatch.fnmatchcase(s, p) for p in rule["source"]) for s, _ in pairs], bool)
        if rule.get("language"):
            ok_code &= np.array([lg in rule["language"] for _, lg in pairs], bool)
        hit = ok_code[codes] if len(pairs) else np.zeros(n, bool)
        if rule.get("path"):
            ok_file = np.array([any(fnmatch.fnmatchcase(p, g) for g in rule["path"]) for p in paths], bool)
            hit &= ok_file[files] if len(paths) else np.zeros(n, bool)
        if rule.get("quality_bucket"):
            hit &= np.isin(buckets[1], [k for k, b in enumerate(buckets[0]) if b in rule["quality_bucket"]]) \
                if buckets is not None else np.zeros(n, bool)
        owner[hit & (owner < 0)] = r
        if rule_kind(rule) == "weight":
            fixed_owner = np.isin(owner, [k for k, x in enumerate(rules) if rule_kind(x) != "weight"])
            home[hit & (home < 0) & ((owner == r) | fixed_owner)] = r
    return owner, home


def draw(tokens: np.ndarray, doc_hash: np.ndarray, target: float, seed: int, salt: int) -> np.ndarray:
    """Copies per document so that their tokens come closest to `target`: every document `k` times
    for the whole epochs in it, then a seeded choice of documents (by a hash of the text) for the
    fraction left, to the nearest document."""
    copies = np.zeros(len(tokens), np.int64)
    total = int(tokens.sum())
    if total <= 0 or target <= 0:
        return copies
    k = int(target // total)
    copies[:] = k
    rest = target - k * total
    order = np.argsort(seeded_unit(doc_hash, seed, salt), kind="stable")
    cum = np.cumsum(tokens[order])
    m = int(np.searchsorted(cum, rest))  # the first document whose inclusion reaches the target
    if m < len(cum) and (cum[m] - rest) <= (rest - (cum[m - 1] if m else 0)):
        m += 1
    copies[order[:m]] += 1
    return copies


def plan_mix(tokens: np.ndarray, doc_hash: np.ndarray, owner: np.ndarray, home: np.ndarray, rules: list[dict],
             rest: str, total_tokens: Optional[int], seed: int) -> tuple[np.ndarray, dict]:
    """Copies per document (0: left out, 2+: repeated) meeting the rules, and what was asked for and
    delivered per rule. Fixed rules (tokens, epochs) and the rest are drawn first; weighted rules
    share what is left of `total_tokens` (null: the largest total every weighted rule's `max_epochs`
    allows), each counting the fixed documents nested in it."""
    tokens = np.asarray(tokens, np.int64)
    copies = np.zeros(len(tokens), np.int64)
    asked: dict[int, float] = {}
    for r, rule in enumerate(rules):
        if rule_kind(rule) == "weight":
            continue
        pool = np.flatnonzero(owner == r)
        avail = int(tokens[pool].sum())
        target = rule["tokens"] if rule.get("tokens") is not None else rule["epochs"] * avail
        if rule.get("tokens") is not None:
            target = min(target, avail * rule.get("max_epochs", 1.0))
        asked[r] = float(rule["tokens"] if rule.get("tokens") is not None else target)
        copies[pool] = draw(tokens[pool], doc_hash[pool], target, seed, salt=100 + r)
    rest_pool = owner < 0
    copies[rest_pool] = 1 if rest == "keep" else 0
    delivered = copies * tokens
    weighted = [r for r, rule in enumerate(rules) if rule_kind(rule) == "weight"]
    outside = float(delivered[(home < 0)].sum())  # fixed tokens no weighted rule counts, and the rest
    t_w = 0.0
    if weighted:
        w = np.array([rules[r]["weight"] for r in weighted], float)
        w = w / w.sum()
        avail = np.array([tokens[owner == r].sum() for r in weighted], float)
        cap = np.array([rules[r].get("max_epochs", 1.0) for r in weighted], float)
        nested = np.array([delivered[(home == r) & (owner != r)].sum() for r in weighted], float)
        t_w = float(total_tokens - outside) if total_tokens is not None else float(np.min((avail * cap + nested) / w))
        t_w = max(0.0, t_w)
        for j, r in enumerate(weighted):
            asked[r] = w[j] * t_w
            pool = np.flatnonzero(owner == r)
            target = float(np.clip(w[j] * t_w - nested[j], 0, avail[j] * cap[j]))
            copies[pool] = draw(tokens[pool], doc_hash[pool], target, seed, salt=100 + r)
        delivered = copies * tokens
    total = float(delivered.sum())
    asked_total = t_w + float(sum(asked[r] for r in range(len(rules)) if r in asked and rule_kind(rules[r]) != "weight"
                                  and not ((home >= 0) & (owner == r)).any())) + float(delivered[rest_pool].sum())
    report = []
    for r, rule in enumerate(rules):
        mine = owner == r
        counted = (home == r) | mine if rule_kind(rule) == "weight" else mine
        got = float(delivered[counted].sum())
        report.append({
            "rule": rule.get("name") or "", "kind": rule_kind(rule), "value": rule[rule_kind(rule)],
            "max_epochs": rule.get("max_epochs", 1.0),
            "documents": int(mine.sum()), "tokens_available": int(tokens[mine].sum()),
            "documents_drawn": int((copies[mine] > 0).sum()), "copies": int(copies[mine].sum()),
            "repeated_copies": int(copies[mine].sum() - (copies[mine] > 0).sum()),
            "documents_left_out": int((mine & (copies == 0)).sum()),
            "tokens_asked": round(asked.get(r, 0.0)), "tokens_delivered": int(got),
            "share_asked": asked.get(r, 0.0) / asked_total if asked_total else 0.0,
            "share_delivered": got / total if total else 0.0,
            "epochs_delivered": float(delivered[mine].sum() / max(1, tokens[mine].sum())),
        })
    rest_info = {"policy": rest, "documents": int(rest_pool.sum()), "tokens": int(tokens[rest_pool].sum()),
                 "tokens_delivered": int(delivered[rest_pool].sum()),
                 "share_delivered": float(delivered[rest_pool].sum()) / total if total else 0.0}
    summary = {"rules": report, "rest": rest_info, "tokens_available": int(tokens.sum()), "tokens_delivered": int(total),
               "documents": int(len(tokens)), "documents_drawn": int((copies > 0).sum()),
               "documents_left_out": int((copies == 0).sum()), "copies": int(copies.sum()),
               "repeated_copies": int(copies.sum() - (copies > 0).sum()), "weighted_total_tokens": round(t_w)}
    return copies, summary


# ---- rehydration: upsampling by duplicate-cluster size ----------------------------------------------

MAX_CHAIN = 64  # removals pointing at removed documents, followed to the keeper; deeper is a cycle


def cluster_sizes(removed: np.ndarray, duplicate_of: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(keeper uids, sorted; their cluster sizes) from a run's removed duplicates: each removed uid
    and the uid it duplicates. A removal may point at a document a later step removed (exact dedup's
    copy of a document near dedup then merged), so each pointer is followed to the document that
    stayed; its cluster is itself plus every removal that ends at it."""
    removed = np.asarray(removed, np.int64)
    target = np.asarray(duplicate_of, np.int64)
    if not len(removed):
        return np.empty(0, np.int64), np.empty(0, np.int64)
    order = np.argsort(removed, kind="stable")
    keys, parent = removed[order], target[order]
    for _ in range(MAX_CHAIN):
        at = np.minimum(np.searchsorted(keys, target), len(keys) - 1)
        again = keys[at] == target
        if not again.any():
            break
        target = np.where(again, parent[at], target)
    else:
        raise ValueError(f"dedup's removed rows hold a chain of more than {MAX_CHAIN} duplicates of duplicates "
                         "(a cycle): rerun dedup")
    roots, counts = np.unique(target, return_counts=True)
    return roots, counts + 1


def rehydrate_copies(uids: np.ndarray, roots: np.ndarray, sizes: np.ndarray,
                     weights: list[dict]) -> tuple[np.ndarray, np.ndarray]:
    """(copies, cluster size) of each document `uids`: the weight whose [min_size, max_size] range
    holds its cluster's size (`cluster_sizes`; 1 when it had no duplicate), 1 when none does."""
    uids = np.asarray(uids, np.int64)
    size = np.ones(len(uids), np.int64)
    if len(roots):
        at = np.minimum(np.searchsorted(roots, uids), len(roots) - 1)
        hit = roots[at] == uids
        size[hit] = sizes[at[hit]]
    copies = np.ones(len(uids), np.int64)
    for w in weights:
        top = w["max_size"] if w.get("max_size") is not None else np.iinfo(np.int64).max
        copies[(size >= w["min_size"]) & (size <= top)] = w["copies"]
    return copies, size


def rehydrate_summary(tokens: np.ndarray, size: np.ndarray, copies: np.ndarray, weights: list[dict]) -> dict:
    """What rehydration did, per weight range and in all: documents, their tokens once, tokens packed."""
    tokens = np.asarray(tokens, np.int64)
    rows = []
    for w in weights:
        top = w["max_size"] if w.get("max_size") is not None else np.iinfo(np.int64).max
        m = (size >= w["min_size"]) & (size <= top)
        rows.append({"sizes": f"{w['min_size']}-{w['max_size']}" if w.get("max_size") is not None else f"{w['min_size']}+",
                     "copies": int(w["copies"]), "documents": int(m.sum()), "tokens_once": int(tokens[m].sum()),
                     "tokens_packed": int((tokens[m] * copies[m]).sum())})
    once, packed = int(tokens.sum()), int((tokens * copies).sum())
    return {"ranges": rows, "documents": int(len(tokens)), "documents_in_clusters": int((size > 1).sum()),
            "largest_cluster": int(size.max()) if len(size) else 0, "tokens_once": once, "tokens_packed": packed,
            "tokens_added": packed - once, "repeated_copies": int((copies - 1).sum())}
