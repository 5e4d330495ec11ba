"""report.html: report.md's content as HTML, plus histograms of the filter scores with their
thresholds drawn, so a person can see where a threshold cuts and tune it.

The Markdown is the one source of the report's text; this module converts the small subset it
uses (headings, tables, lists, bold, code) and inserts the plots (PNG, embedded as base64, so the
file stands alone).
"""
from __future__ import annotations

import base64
import contextlib
import html
import io
import os
import re
from pathlib import Path
from typing import Any, Optional
from corpusmill.stages.base import read_table

MAX_SCORE_ROWS = 50_000  # documents drawn to place the histograms' bins (a seeded sample over all parts)
STYLE = """
body { font-family: -apple-system, "Segoe UI", "Noto Sans CJK SC", "PingFang SC", sans-serif; margin: 2em auto;
       max-width: 1200px; padding: 0 1em; color: #222; line-height: 1.45; }
table { border-collapse: collapse; margin: 0.6em 0 1.2em; font-size: 0.92em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; vertical-align: top; }
th { background: #f2f2f2; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
code { background: #f4f4f4; padding: 0 0.25em; border-radius: 3px; }
h1 { border-bottom: 2px solid #444; } h2 { border-bottom: 1px solid #bbb; margin-top: 1.6em; }
.plots { display: grid; grid-template-columns: repeat(auto-fill, minmax(360px, 1fr)); gap: 1em; }
.plots figure { margin: 0; border: 1px solid #ddd; padding: 0.4em; background: #fff; }
.plots figcaption { font-size: 0.85em; color: #444; }
li { margin: 0.15em 0; }
"""


def _inline(text: str) -> str:
    out = html.escape(text, quote=False)
    out = re.sub(r"`([^`]+)`", r"<code>\1</code>", out)
    return re.sub(r"\*\*([^*]+)\*\*", r"<strong>\1</strong>", out)


def _cells(row: str) -> list[str]:
    return [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", row.strip().strip("|"))]


def markdown_to_html(md: str) -> str:
    """The Markdown subset report.md uses."""
    out: list[str] = []
    lines = md.split("\n")
    i = 0
    while i < len(lines):
        line = lines[i]
        m = re.match(r"^(#{1,4}) (.*)$", line)
        if m:
            level = len(m.group(1))
            anchor = re.sub(r"[^a-z0-9]+", "-", m.group(2).lower()).strip("-")
            out.append(f'<h{level} id="{anchor}">{_inline(m.group(2))}</h{level}>')
        elif line.startswith("|"):
            rows = []
            while i < len(lines) and lines[i].startswith("|"):
                rows.append(lines[i])
                i += 1
            head, body = _cells(rows[0]), [r for r in rows[1:] if not re.match(r"^\|[-:| ]+\|$", r)]
            out.append("<table><thead><tr>" + "".join(f"<th>{_inline(c)}</th>" for c in head) + "</tr></thead><tbody>")
            for r in body:
                out.append("<tr>" + "".join(
                    f'<td class="num">{_inline(c)}</td>' if re.fullmatch(r"[-+]?[\d,.]+%?|-", c) else f"<td>{_inline(c)}</td>"
                    for c in _cells(r)) + "</tr>")
            out.append("</tbody></table>")
            continue
        elif line.startswith("- "):
            out.append("<ul>")
            while i < len(lines) and lines[i].startswith("- "):
                out.append(f"<li>{_inline(lines[i][2:])}</li>")
                i += 1
            out.append("</ul>")
            continue
        elif line.strip():
            out.append(f"<p>{_inline(line)}</p>")
        i += 1
    return "\n".join(out)


def _read_scores(scores_dir: str, columns: list[str]) -> Optional[dict]:
    """A seeded sample of at most MAX_SCORE_ROWS documents, drawn evenly from every part (inputs are
    often grouped by language or source, so the first parts alone would mislead): each score column
    as float64 (NaN where a part lacks it) and `zh`, whether the document was scored as Chinese. The
    rows are drawn from the parts' row counts first, so each column is one array filled part by part:
    a frame per part, concatenated, held the sample twice (+200 MB in the driver at 300,000 rows)."""
    import numpy as np
    import pyarrow.parquet as pq

    from .engine import release_memory

    paths = _score_paths(scores_dir)
    if not paths:
        return None
    sizes = [pq.ParquetFile(p).metadata.num_rows for p in paths]
    rate = min(1.0, MAX_SCORE_ROWS / max(1, sum(sizes)))
    rng = np.random.default_rng(0)
    picks = [np.flatnonzero(rng.random(n) < rate) if rate < 1.0 else None for n in sizes]
    total = sum(n if p is None else len(p) for n, p in zip(sizes, picks))
    out = {c: np.full(total, np.nan) for c in columns if c != "lang"}
    out["zh"] = np.zeros(total, bool)
    seen, at = {"zh"}, 0
    for path, pick in zip(paths, picks):
        names = set(pq.read_schema(path).names)
        seen |= names
        table = read_table(path, columns=[c for c in columns if c in names])
        if pick is not None:
            table = table.take(pick)
        end = at + table.num_rows
        for c in table.column_names:
            if c == "lang":
                out["zh"][at:end] = _is_zh(table.column(c))
            else:
                out[c][at:end] = table.column(c).to_numpy(zero_copy_only=False)
        at = end
        del table
        release_memory()  # what reading the part took, given back before the next
    return {c: v for c, v in out.items() if c in seen}


def _score_paths(scores_dir: str) -> list[Path]:
    return sorted(Path(scores_dir).glob("part-*.parquet"))


def _is_zh(lang: Any) -> Any:
    """Whether each document was scored as Chinese (a null language is not)."""
    import pyarrow.compute as pc

    return pc.fill_null(pc.equal(lang, "zh"), False).to_numpy(zero_copy_only=False)


def histogram_counts(scores_dir: str, bins: dict[str, Any], rules: dict[str, list[dict]]) -> dict:
    """Exact histograms of every scored document, read one part at a time (the driver holds one
    part's score columns, whatever the corpus): per column in `bins`, the counts of non-Chinese and
    Chinese documents in those bins (values outside clipped to the end bins), and per rule of
    `rules[column]` how many documents it applies to and how many of them fail it. A part without a
    column (written before the score existed) counts none of its documents for it."""
    import numpy as np
    import pyarrow.parquet as pq

    from .engine import release_memory

    out = {c: {"counts": np.zeros((2, len(b) - 1), np.int64), "applies": np.zeros(len(rules.get(c, [])), np.int64),
               "fails": np.zeros(len(rules.get(c, [])), np.int64)} for c, b in bins.items()}
    guards = {r["guard"][0] for rs in rules.values() for r in rs if r.get("guard")}
    for path in _score_paths(scores_dir):
        names = set(pq.read_schema(path).names)
        table = read_table(path, columns=[c for c in dict.fromkeys(["lang", *bins, *guards]) if c in names])
        n = table.num_rows
        zh = _is_zh(table.column("lang")) if "lang" in names else np.zeros(n, bool)
        for c, b in bins.items():
            values = _as_floats(table, c, n)
            finite = np.isfinite(values)
            clipped = np.clip(values, b[0], b[-1])
            for row, mask in enumerate((~zh, zh)):
                out[c]["counts"][row] += np.histogram(clipped[mask & finite], bins=b)[0]
            for k, r in enumerate(rules.get(c, [])):
                applies = {"zh": zh, "non_zh": ~zh, "all": np.ones(n, bool)}[r["applies_to"]] & finite
                if r.get("guard"):
                    applies &= _as_floats(table, r["guard"][0], n) >= r["guard"][1]
                fails = values < r["threshold"] if r["kind"] == "min" else values > r["threshold"]
                out[c]["applies"][k] += int(applies.sum())
                out[c]["fails"][k] += int((fails & applies).sum())
        del table
        release_memory()  # the driver read 171 parts of a 5 GB run: kept, their memory grew it by 50 MB
    return out


def _as_floats(table: Any, name: str, rows: int) -> Any:
    """A score column as float64, all NaN when the part has no such column."""
    import numpy as np

    if name not in table.column_names:
        return np.full(rows, np.nan)
    return table.column(name).to_numpy(zero_copy_only=False).astype(float, copy=False)


def score_plots(extra: dict) -> list[tuple[str, str]]:
    """(caption, base64 PNG) per scored rule: histograms of every scored document, Chinese and
    other, the threshold as a red line, the share of scored documents on the failing side in the
    caption. A seeded sample (`_read_scores`) only places the bins (0.5-99.5 percentile, widened to
    the thresholds); the counts are exact (`histogram_counts`), so the driver holds a part at a time
    and not a sample that grew with the corpus up to MAX_SCORE_ROWS documents."""
    flt = extra.get("filter") or {}
    rules, scores_dir = flt.get("rules") or {}, flt.get("scores_dir")
    if not rules or not scores_dir or not Path(scores_dir).is_dir():
        return []  # before importing matplotlib: a second of the driver's CPU in a job without a filter (dedup)
    import numpy as np

    by_column: dict[str, list[dict]] = {}
    for r in rules:
        by_column.setdefault(r["column"], []).append(r)
    sample = _read_scores(scores_dir, list(dict.fromkeys(["lang", *by_column])))
    if sample is None or not len(sample["zh"]):
        return []
    bins = {}
    for column, entries in by_column.items():
        values = sample.get(column)
        finite = np.isfinite(values) if values is not None else None
        if finite is None or not finite.any():
            continue
        lo, hi = np.percentile(values[finite], [0.5, 99.5])
        lo, hi = min(lo, *(r["threshold"] for r in entries)), max(hi, *(r["threshold"] for r in entries))
        bins[column] = np.linspace(lo, hi if hi > lo else lo + 1, 50)
    del sample
    counted = histogram_counts(scores_dir, bins, {c: by_column[c] for c in bins})
    plt = _pyplot()

    plots = []
    for column, b in bins.items():
        found = counted[column]
        fig, ax = plt.subplots(figsize=(4.6, 2.9), dpi=110)
        for counts, label, color in zip(found["counts"], ("en / other", "zh"), ("#1f77b4", "#ff7f0e")):
            if counts.sum():
                ax.stairs(counts, b, linewidth=1.5, label=f"{label} ({int(counts.sum()):,})", color=color)
        parts = []
        for k, r in enumerate(by_column[column]):
            ax.axvline(r["threshold"], color="#d62728", linestyle="--", linewidth=1.2)
            share = found["fails"][k] / max(1, found["applies"][k])
            parts.append(f"{r['reason']}: keeps {'≥' if r['kind'] == 'min' else '≤'} {r['threshold']:g} "
                         f"({r['applies_to'].replace('_', '-')}); {share:.1%} fail")
        plots.append(("; ".join(parts), _log_histogram_png(fig, ax, column)))
    return plots


CJK_FONTS = ["WenQuanYi Micro Hei", "Noto Sans CJK SC", "Source Han Sans SC", "SimHei", "Microsoft YaHei"]


def _pyplot():  # type: ignore[no-untyped-def]
    """matplotlib off screen, with a Chinese font as fallback when one is installed (Debian's
    fonts-wqy-microhei, Noto CJK): Chinese source names are drawn, not shown as boxes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib import font_manager

    have = {f.name for f in font_manager.fontManager.ttflist}
    if not have & set(CJK_FONTS):  # matplotlib's font cache may predate the font's installation
        for path in font_manager.findSystemFonts():
            if any(k in os.path.basename(path).lower() for k in ("wqy", "notosanscjk", "sourcehansans")):
                with contextlib.suppress(Exception):  # a font file matplotlib cannot read is no fallback
                    font_manager.fontManager.addfont(path)
        have = {f.name for f in font_manager.fontManager.ttflist}
    plt.rcParams["font.family"] = ["DejaVu Sans"] + [f for f in CJK_FONTS if f in have]  # per-glyph fallback
    return plt


def _png(fig) -> str:  # type: ignore[no-untyped-def]
    """A finished figure as a base64 PNG (the report embeds its images), closed after."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _log_histogram_png(fig, ax, title: str) -> str:  # type: ignore[no-untyped-def]
    """The score histograms' common finish: a log count axis, the score's name, a small legend."""
    ax.set_yscale("log")
    ax.set_title(title, fontsize=10)
    ax.tick_params(labelsize=8)
    ax.legend(fontsize=7, frameon=False)
    return _png(fig)


def composition_plot(ledger: Optional[dict]) -> Optional[str]:
    """A stacked bar per step, from the input to the shards, of the tokens of each source and
    language (base64 PNG). Before tokenizing, a group's tokens are estimated from its characters at
    that step and its own tokens per character once tokenized (the caption says so)."""
    comp = (ledger or {}).get("composition") or {}
    groups = comp.get("groups") or []
    if not groups or not any(g.get("tokenized") for g in groups):
        return None
    plt = _pyplot()

    steps = list(dict.fromkeys(st for g in groups for st in g["steps"]))
    columns = ["input"] + [s for s in steps if s != "read"] + ["tokenized", "shards"]
    fig, ax = plt.subplots(figsize=(8.5, 3.8), dpi=110)
    bottom = [0.0] * len(columns)
    cmap = plt.get_cmap("tab20")
    for k, g in enumerate(groups):
        tok = g.get("tokenized") or {}
        per_char = tok.get("tokens", 0) / max(1, tok.get("chars", 0))
        values = [g["chars"] * per_char] + [g["steps"].get(s, {}).get("chars", 0) * per_char for s in columns[1:-2]]
        values += [tok.get("tokens", 0), (g.get("shards") or {}).get("tokens", 0)]
        ax.bar(columns, values, bottom=bottom, color=cmap(k % 20), label=f"{g['source']} / {g['language']}")
        bottom = [b + v for b, v in zip(bottom, values)]
    ax.set_ylabel("tokens")
    ax.tick_params(labelsize=8)
    ax.legend(fontsize=7, frameon=False, bbox_to_anchor=(1.01, 1), loc="upper left")
    return _png(fig)


def classifier_plots(stats: Optional[dict]) -> list[tuple[str, str]]:
    """(caption, base64 PNG) per classifier score (and their mean): the documents it scored by language
    over 20 bins of [0, 1] (from the scoring pass's exact counts), the resolved threshold dashed red."""
    c = ((stats or {}).get("filter") or {}).get("classifiers") or {}
    hists = c.get("histograms") or {}
    if not hists:
        return []
    plt = _pyplot()
    import numpy as np

    limits = {d["column"]: d["threshold"] for d in c.get("decisions") or []}
    edges = np.linspace(0, 1, 21)
    plots = []
    for column, by_lang in hists.items():
        fig, ax = plt.subplots(figsize=(4.6, 2.9), dpi=110)
        for lg, counts in sorted(by_lang.items()):
            counts = np.asarray(counts)
            if counts.sum():
                ax.stairs(counts, edges, linewidth=1.5, label=f"{lg or '-'} ({int(counts.sum()):,})")
        caption = f"{column}: documents scored, by language"
        if limits.get(column) is not None:
            ax.axvline(min(1.0, limits[column]), color="#d62728", linestyle="--", linewidth=1.2)
            caption += f"; keeps >= {limits[column]:.4g}"
        plots.append((caption, _log_histogram_png(fig, ax, column)))
    return plots


def _drawn(what: str, draw: Any, arg: Any) -> tuple[list, str]:
    """(the plots `draw(arg)` makes, "") or ([], a line saying why they could not be drawn): a plotting
    problem must not cost a finished run its report."""
    try:
        return draw(arg), ""
    except Exception as e:  # noqa: BLE001 - any failure of matplotlib or of the stats it reads
        return [], (f"<p><strong>The {what} plots could not be drawn: {html.escape(type(e).__name__)}: "
                    f"{html.escape(str(e))}</strong></p>")


def render_html(markdown: str, extra: dict, title: Optional[str] = None, ledger: Optional[dict] = None,
                stats: Optional[dict] = None) -> str:
    body = markdown_to_html(markdown)
    from .extras import hint, installed

    if not installed("matplotlib"):  # the report itself needs no plotting: one line says what would add the plots
        return _page(f"<p><em>No plots: {html.escape(hint('matplotlib'))}.</em></p>" + body, title)
    learned, failed = _drawn("classifier", classifier_plots, stats)
    body = failed + body
    if learned:
        marker = '<h2 id="quality-classifiers'
        figures = "\n".join(f'<figure><img alt="{html.escape(c)}" src="data:image/png;base64,{b}" width="100%">'
                            f"<figcaption>{html.escape(c)}</figcaption></figure>" for c, b in learned)
        at = body.find("</h2>", body.find(marker)) + len("</h2>") if marker in body else len(body)
        body = body[:at] + f'<div class="plots">{figures}</div>' + body[at:]
    try:
        bars = composition_plot(ledger)
    except Exception as e:  # noqa: BLE001 - a plotting problem must not cost a finished run its report
        bars = None
        body = (f'<p><strong>The composition plot could not be drawn: {html.escape(type(e).__name__)}: '
                f"{html.escape(str(e))}</strong></p>") + body
    if bars:
        marker = '<h2 id="by-source-and-language">'
        figure = (f'<figure><img alt="tokens per source and language, step by step" src="data:image/png;base64,{bars}" '
                  'width="100%"><figcaption>Tokens per source and language from the input to the shards (before '
                  "tokenizing: each group's characters at that step times its own tokens per character).</figcaption>"
                  "</figure>")
        at = body.find("</h2>", body.find(marker)) + len("</h2>") if marker in body else len(body)
        body = body[:at] + figure + body[at:]
    plots, failed = _drawn("score", score_plots, extra)
    body = failed + body
    if plots:
        figures = "\n".join(f'<figure><img alt="{html.escape(c)}" src="data:image/png;base64,{b}" width="100%">'
                            f"<figcaption>{html.escape(c)}</figcaption></figure>" for c, b in plots)
        section = ('<h2 id="score-distributions">Score distributions</h2><p>Every scored document, by '
                   "language (the bins placed from a seeded sample); the dashed red line is the threshold, the caption the share "
                   "that fails it (documents failing an earlier rule are counted here too). Change a threshold in "
                   "<code>filter:</code> and rerun with <code>--resume</code>: the scores are reused.</p>"
                   f'<div class="plots">{figures}</div>')
        marker = '<h2 id="removed-by-stage-and-reason">'
        body = body.replace(marker, section + "\n" + marker, 1) if marker in body else body + section
    return _page(body, title)


def _page(body: str, title: Optional[str]) -> str:
    return (f"<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>{html.escape(title or 'corpusmill run report')}"
            f"</title><style>{STYLE}</style></head><body>{body}</body></html>")
