"""Dedup phase 0: one pass over every part that reads and normalises each document once and writes
what every dedup phase after it needs: the exact hash (exact dedup) and the MinHash / SimHash
signatures with the keep attributes (near dedup). The first dedup step of the plan makes it; the
near step then takes its documents' rows from it instead of reading and normalising every text again.
Finding stays apart from removing: these files only feed the find phases."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, Optional

from dask import delayed

from corpusmill.stages import near_dedup
from corpusmill.stages.base import write_text_atomic
from corpusmill.stages.shingles import ShingleSpec

from ...config import Config
from ...step import StepContext

SPEC_FILE = "_spec.json"
FULL_SPEC_FILE = "_spec_full.json"  # the whole spec, exact hash included (the read step's signatures)


def signature_spec(cfg: Config, normalize_opts: Optional[dict], exact: bool = False,
                   near: bool = True) -> near_dedup.SignatureSpec:
    """What the signature pass computes: the exact hash (`exact`) and, with `near`, the enabled near
    methods' signatures, shingled as `dedup.shingling` says."""
    dc, sh = cfg.dedup, cfg.dedup.shingling
    return near_dedup.SignatureSpec(
        minhash=ShingleSpec(dc.minhash.word_ngram, dc.minhash.char_ngram, sh.lowercase, sh.strip_punctuation,
                            sh.cjk_share, sh.unit) if near and dc.minhash.enabled else None,
        num_perm=dc.minhash.num_perm,
        seed=dc.minhash.seed,
        simhash=ShingleSpec(dc.simhash.word_ngram, dc.simhash.char_ngram, sh.lowercase, sh.strip_punctuation,
                            sh.cjk_share, dc.simhash.unit) if near and dc.simhash.enabled else None,
        verify=ShingleSpec(dc.minhash.word_ngram, dc.minhash.char_ngram, sh.lowercase, sh.strip_punctuation,
                           sh.cjk_share, sh.unit),
        keep_field=dc.keep_field if dc.keep == "field" else None,
        normalize=normalize_opts,
        exact=exact,
    )


def _spec_json(spec: near_dedup.SignatureSpec) -> str:
    return json.dumps(dataclasses.asdict(spec.near()), sort_keys=True)


def full_spec_json(spec: near_dedup.SignatureSpec) -> str:
    """The spec with its exact flag: the read step's task fingerprint and the marker exact dedup checks."""
    return json.dumps(dataclasses.asdict(spec), sort_keys=True)


def read_spec(cfg: Config, normalize_opts: Optional[dict]) -> Optional[near_dedup.SignatureSpec]:
    """What a dedup job's read step signs each part with while it is in memory: the first dedup step's
    spec when that step reads the read step's parts (no reference_dedup between them), else None."""
    dc = cfg.dedup
    near = dc.minhash.enabled or dc.simhash.enabled
    if dc.reference or not (dc.exact or near):
        return None
    return signature_spec(cfg, normalize_opts, exact=dc.exact, near=near)


def mark(folder: Path, spec: near_dedup.SignatureSpec) -> None:
    """Say, beside signatures made elsewhere (the read step), which spec made them."""
    folder.mkdir(parents=True, exist_ok=True)
    write_text_atomic(folder / FULL_SPEC_FILE, full_spec_json(spec))
    write_text_atomic(folder / SPEC_FILE, _spec_json(spec))


def compute(ctx: StepContext, parts: list[str], folder: Path, spec: near_dedup.SignatureSpec, label: str,
            exclude: Any = None) -> list[dict]:
    """`near_dedup.signature_part` of every part into `folder` (named as the parts), one task each,
    leaving out the uids `exclude` (a sorted array or its broadcast); the spec is written beside them
    so a later step reuses them only when it needs the same."""
    folder.mkdir(parents=True, exist_ok=True)
    results = ctx.run([delayed(near_dedup.signature_part)(p, str(folder / Path(p).name), spec, exclude)
                       for p in parts], label)
    mark(folder, spec)
    return results


def reusable(folder: Path, spec: near_dedup.SignatureSpec, parts: list[str], full: bool = False) -> bool:
    """True when `folder` holds signatures made with `spec`'s near settings (`full`: the whole spec,
    the exact hash included) for every one of `parts` (by name: a dedup step writes its parts under
    its input's names)."""
    marker = folder / (FULL_SPEC_FILE if full else SPEC_FILE)
    if not marker.is_file() or marker.read_text() != (full_spec_json(spec) if full else _spec_json(spec)):
        return False
    return all((folder / Path(p).name).is_file() for p in parts)
