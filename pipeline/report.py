"""report.md: what a person reads after a run — counts, reasons, examples, tokens, shards, timing."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

from stages.base import write_text_atomic


def _pct(n: int, total: int) -> str:
    return f"{100 * n / total:.1f}%" if total else "-"


def _md_escape(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ⏎ ").replace("`", "'")


def render_report(ledger: dict, stats: dict, extra: dict, seconds: dict, train: Optional[dict]) -> str:
    total = ledger["input"]
    lines = ["# corpusmill run report", ""]
    run = ledger.get("run", {})
    lines += [f"corpusmill {run.get('corpusmill_version', '?')}, finished {run.get('finished_utc', '?')}, "
              f"wall time {run.get('wall_s', 0):.1f}s"
              + (f"; resumed (skipped): {', '.join(run['resumed_stages'])}" if run.get("resumed_stages") else ""), ""]
    sample = ledger.get("sample")
    if sample:
        p = sample["projected_full_run"]
        lines += [f"**This was a SAMPLE RUN on {sample['fraction']:.2%} of the documents** (seed {sample['seed']}; "
                  f"{sample['documents_not_sampled']:,} documents not sampled). Every figure below is the sample's.", "",
                  "Projected full run:", "", "| figure | projected |", "|---|---:|"]
        for key, value in p.items():
            lines.append(f"| {key} | {value:,.1f} |" if isinstance(value, float) else f"| {key} | {value:,} |")
        lines += ["", f"({sample['note']}.)", ""]

    lines += ["## Documents", "", "| outcome | documents | share of input |", "|---|---:|---:|"]
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
    lines.append("")

    lines += ["## Stages", "", "| stage | in | out | removed | seconds |", "|---|---:|---:|---:|---:|"]
    for name, s in ledger["stages"].items():
        lines.append(f"| {name} | {s['in']:,} | {s['out']:,} | {sum(s['removed'].values()):,} | {seconds.get(name, 0):.1f} |")
    for name in ("tokenize", "pack", "shard"):
        if name in stats:
            lines.append(f"| {name} | | | | {seconds.get(name, 0):.1f} |")
    lines.append("")

    lines += ["## Removed, by stage and reason", "", "| stage | reason | documents | share of input |", "|---|---|---:|---:|"]
    for name, s in ledger["stages"].items():
        for reason, n in sorted(s["removed"].items(), key=lambda kv: -kv[1]):
            lines.append(f"| {name} | {reason} | {n:,} | {_pct(n, total)} |")
    lines.append("")

    flt = stats.get("filter") or {}
    rules = extra.get("filter", {}).get("rules") or {}
    if rules:
        from stages.quality import describe_rules

        meaning = describe_rules()
        removed_f = flt.get("removed", {})
        lines += ["### Filter rules (first failing rule is the reason; thresholds from `filter:`)", "",
                  "| reason | score | keeps when | applies to | removed | what it means |", "|---|---|---|---|---:|---|"]
        shown = set()
        for r in rules:
            name = r["reason"]
            cmp = ">=" if r["kind"] == "min" else "<="
            scope = r["applies_to"].replace("_", "-") + (f", {r['guard'][0]} >= {r['guard'][1]:g}" if r.get("guard") else "")
            count = f"{removed_f.get(name, 0):,}" if name not in shown else "(above)"
            shown.add(name)
            lines.append(f"| {name} | `{r['column']}` | {cmp} {r['threshold']:g} | {scope} | {count} | {meaning.get(name, '')} |")
        lines.append("")
    if flt.get("by_lang"):
        lines += ["### Filter by language (detected from Unicode scripts)", "",
                  "| language | in | kept | removed | top reasons |", "|---|---:|---:|---:|---|"]
        for lang, c in sorted(flt["by_lang"].items(), key=lambda kv: -kv[1]["in"]):
            top = sorted((flt.get("removed_by_lang", {}).get(lang) or {}).items(), key=lambda kv: -kv[1])[:4]
            lines.append(f"| {lang} | {c['in']:,} | {c['out']:,} | {c['in'] - c['out']:,} | "
                         + ", ".join(f"{k} {v:,}" for k, v in top) + " |")
        lines.append("")
    if flt.get("by_source"):
        lines += ["### Filter by source", "", "| source | in | kept | removed | boilerplate lines removed | top reasons |",
                  "|---|---:|---:|---:|---:|---|"]
        for src, c in sorted(flt["by_source"].items(), key=lambda kv: -kv[1]["in"])[:40]:
            top = sorted((flt.get("removed_by_source", {}).get(src) or {}).items(), key=lambda kv: -kv[1])[:3]
            lines.append(f"| {_md_escape(src)} | {c['in']:,} | {c['out']:,} | {c['in'] - c['out']:,} | "
                         f"{flt.get('lines_removed_by_source', {}).get(src, 0):,} | " + ", ".join(f"{k} {v:,}" for k, v in top) + " |")
        if len(flt["by_source"]) > 40:
            lines.append(f"| ({len(flt['by_source']) - 40} more sources in `02-filter/_DONE.json`) | | | | | |")
        bl = flt.get("boilerplate_lines") or {}
        lines += ["", f"Boilerplate lines: {bl.get('distinct_lines', 0):,} distinct lines recur in enough documents of their "
                  f"source to be removed; {flt.get('lines_removed', 0):,} line occurrences removed in all."
                  + (" Scores were reused from an earlier run (only the thresholds changed)." if flt.get("scores_reused") else ""),
                  ""]
        top_lines = bl.get("top") or []
        if top_lines:
            lines += [f"Most frequent removed boilerplate lines ({len(top_lines)} of {bl.get('distinct_lines', 0):,}; all "
                      "hashes in `02-filter.scores/boilerplate_lines.parquet`):", "",
                      "| times removed | documents containing it | source | line |", "|---:|---:|---|---|"]
            for t in top_lines:
                text = t.get("line")
                shown = _md_escape(text[:160] + ("…" if len(text) > 160 else "")) if text is not None else \
                    f"(hash {t['hash']}; its text was not met when stripping)"
                lines.append(f"| {t.get('removed', 0):,} | {t['docs']:,} | {_md_escape(t['source'])} | {shown} |")
            lines.append("")

    q = extra.get("read", {}).get("quarantine_examples") or []
    if q:
        lines += ["### Quarantined records (first 10; all in `00-read/quarantine.jsonl`)", "",
                  "| file | line | reason |", "|---|---:|---|"]
        for rec in q[:10]:
            lines.append(f"| {rec['file']} | {rec['line'] if rec['line'] is not None else '-'} | {_md_escape(rec['reason'])} |")
        lines.append("")
    examples = extra.get("filter", {}).get("examples") or {}
    if examples:
        lines += ["### Filtered examples (first 300 characters)", ""]
        for reason, items in examples.items():
            for item in items:
                lines.append(f"- `{reason}` (score {item['score']:g}) {item['id']}: {_md_escape(item['text'])!s}")
        lines.append("")
    dups = extra.get("exact_dedup", {}).get("examples") or []
    if dups:
        lines += ["### Exact duplicates (first 10)", "", "| removed | duplicate of | cluster size |", "|---|---|---:|"]
        for d in dups:
            lines.append(f"| {_md_escape(str(d['id']))} | {_md_escape(str(d['duplicate_of_id']))} | {d['cluster_size']} |")
        lines.append("")

    near = stats.get("near_dedup")
    if near:
        lines += ["## Near duplicates", ""]
        if "minhash_bands" in near:
            lines.append(f"- MinHash LSH: {near['minhash_bands']} bands x {near['minhash_rows']} rows")
        lines.append("- candidate edges kept: " + (", ".join(f"{k} {v:,}" for k, v in near.get("edges", {}).items()) or "none"))
        lines.append(f"- connected components computed {near.get('components_mode', '?').replace('_', ' ')}")
        if near.get("clusters"):
            lines.append(f"- {near['clusters']:,} clusters, largest {near['largest_cluster']}; documents per cluster: "
                         + ", ".join(f"{k}: {v:,}" for k, v in near["cluster_sizes"].items()))
        examples = extra.get("near_dedup", {}).get("examples") or []
        if examples:
            lines += ["", "| removed | kept | method | similarity | cluster size |", "|---|---|---|---:|---:|"]
            for e in examples:
                lines.append(f"| {_md_escape(str(e['id']))} | {_md_escape(str(e['duplicate_of_id']))} | {e['reason']} | "
                             f"{e['score']:.3f} | {e['cluster_size']} |")
        lines.append("")

    tok = extra.get("tokenize", {}).get("tokenizer")
    if tok:
        lines += ["## Tokenizer", "",
                  f"- model: `{tok['path']}` ({tok['origin']}), sha256 `{tok['sha256'][:16]}…`",
                  f"- vocabulary {tok['vocab_size']:,}; bos {tok['bos_id']}, eos {tok['eos_id']}, unk {tok['unk_id']}, "
                  f"pad {tok['pad_id']} ({tok['pad_source']})",
                  f"- sample of {tok['sample_docs']} documents: <unk> rate {tok['unk_rate']:.4%}, "
                  f"encode→decode mismatches {tok['roundtrip_mismatch_rate']:.1%}"]
        if tok.get("model_vocab_size"):
            lines.append(f"- model vocab_size {tok['model_vocab_size']:,}; embedding rows never trained: {tok['unused_embedding_rows']:,}")
        for w in tok.get("warnings", []):
            lines.append(f"- warning: {w}")
        lines.append("")
    if "tokenize" in stats:
        t = stats["tokenize"]
        lines += ["## Tokens, packing and shards", "",
                  f"- {t['docs_in']:,} documents → {t['tokens']:,} tokens ({t['tokens'] / max(1, t['docs_in']):.0f} per document)"]
    if "pack" in stats:
        p = stats["pack"]
        lines += [f"- packing `{p['mode']}`: {p['windows']:,} windows; {p['docs_split']:,} documents split across windows, "
                  f"{p['docs_truncated']:,} truncated; tokens kept {p['tokens_kept']:,} of {p['tokens_in']:,} "
                  f"({p['tokens_dropped']:,} dropped); {p['pad_tokens']:,} pad tokens = {100 * p['padding_share']:.2f}% padding"]
    if "shard" in stats:
        s = stats["shard"]
        lines += [f"- {s['samples']:,} samples in {s['files']} MindRecord files: {s['samples_per_rank']:,} per rank, "
                  f"{s['dropped_samples']:,} dropped so every rank holds the same count; {s['tokens']:,} tokens, "
                  f"{s['bytes'] / 1e6:.1f} MB (`shards/manifest.json`)"]
    lines.append("")
    if train:
        lines += ["## Training", "",
                  f"- {train['steps']} steps on rank {train['rank']}: loss {train['first_loss']:.3f} → {train['last_loss']:.3f} "
                  f"(mean of first/last 10%: {train['loss_start_mean']:.3f} → {train['loss_end_mean']:.3f})",
                  f"- {train['tokens'] / max(train['wall_s'], 1e-9):,.0f} tokens/s; waiting for data "
                  f"{100 * train['data_wait_share']:.1f}% of the time; metrics in `train/metrics.jsonl`", ""]
    return "\n".join(lines)


def write_report(out: Path, ledger: dict, stats: dict, extra: dict, seconds: dict, train: Optional[dict]) -> Path:
    """report.md, and report.html: the same content with histograms of the filter scores."""
    from .report_html import render_html

    text = render_report(ledger, stats, extra, seconds, train)
    path = Path(out) / "report.md"
    write_text_atomic(path, text)
    write_text_atomic(Path(out) / "report.html", render_html(text, extra))
    return path
