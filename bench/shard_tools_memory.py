"""Peak memory of the token-level tools (`corpusmill shards merge / reshard / reweight`) on a shard set
and on one about ten times larger, side by side in one run: the tools stream, so the ratio of their
peaks should stay near 1 while the data grows tenfold.

    python bench/shard_tools_memory.py SHARDS --work /work/bench-tools [--copies 10] [--json OUT.json]

SHARDS is any verified MindRecord shard set (e.g. the real-corpus run's `shards/`, bench/real_corpus.sh).
The large set is SHARDS merged with itself `--copies` times: that merge is the large merge, set beside
SHARDS merged with itself twice. Each tool verifies its inputs in full first and its output after, so the
figures include MindDataset's reads (the large merge verifies its input `--copies` times).
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from measure import measure  # noqa: E402


def _set_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def _mix_file(shards: Path, work: Path) -> Path:
    """A mix asking for half of every (source, language) group's tokens: a real reweight of any set."""
    manifest = json.loads((shards / "manifest.json").read_text())
    groups = (manifest.get("composition") or {}).get("groups") or []
    tokens: dict = {}
    for g in groups:
        got = g.get("tokens") or (g.get("packed") or {}).get("tokens") or 0
        if got:
            tokens.setdefault(g["source"], {})[g["language"]] = max(1, int(got) // 2)
    if not tokens:
        raise SystemExit(f"{shards}/manifest.json has no composition to reweight")
    path = work / "mix.yaml"
    path.write_text(json.dumps({"tokens": tokens}))  # JSON is YAML
    return path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("shards")
    ap.add_argument("--work", default=None, help="scratch folder (default: a temporary one, removed after)")
    ap.add_argument("--copies", type=int, default=10)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    small = Path(args.shards).resolve()
    work = Path(args.work or tempfile.mkdtemp(prefix="corpusmill-tools-"))
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    cm = [str(Path(sys.executable).with_name("corpusmill"))]
    rows = []

    def run(label: str, size: str, cmd: list[str]) -> None:
        r = measure(cm + cmd)
        if r["returncode"]:
            raise SystemExit(f"{label} ({size}) failed: {' '.join(cmd)}")
        rows.append({"tool": label, "set": size, **{k: r[k] for k in ("wall_s", "cpu_s", "peak_rss_tree_mb")}})
        print(f"{label:8s} {size:6s} {r['wall_s']:7.1f} s wall {r['cpu_s']:7.1f} CPU s  peak {r['peak_rss_tree_mb']:6,} MB",
              flush=True)

    big = work / "big"
    run("merge", "large", ["shards", "merge", *([str(small)] * args.copies), "--out", str(big)])
    mix = _mix_file(small, work)
    sizes = {"small": (small, _set_bytes(small)), "large": (big, _set_bytes(big))}
    run("merge", "small", ["shards", "merge", str(small), str(small), "--out", str(work / "merge-small")])
    shutil.rmtree(work / "merge-small")
    for size, (folder, _) in sizes.items():
        run("reshard", size, ["shards", "reshard", str(folder), "--ranks", "3", "--out", str(work / f"reshard-{size}")])
        shutil.rmtree(work / f"reshard-{size}")
        run("reweight", size, ["shards", "reweight", str(folder), "--mix", str(mix), "--out", str(work / f"rew-{size}")])
        shutil.rmtree(work / f"rew-{size}")
    print(f"\nsets: small {sizes['small'][1] / 2**30:.2f} GiB, large {sizes['large'][1] / 2**30:.2f} GiB "
          f"({sizes['large'][1] / sizes['small'][1]:.1f}x)")
    print("| tool | small peak MB | large peak MB | peak ratio | small CPU s | large CPU s |\n|---|---:|---:|---:|---:|---:|")
    table = []
    for tool in ("merge", "reshard", "reweight"):
        s = next(r for r in rows if r["tool"] == tool and r["set"] == "small")
        g = next(r for r in rows if r["tool"] == tool and r["set"] == "large")
        ratio = g["peak_rss_tree_mb"] / max(1, s["peak_rss_tree_mb"])
        table.append({"tool": tool, "small": s, "large": g, "peak_ratio": round(ratio, 2)})
        print(f"| {tool} | {s['peak_rss_tree_mb']:,} | {g['peak_rss_tree_mb']:,} | {ratio:.2f} | {s['cpu_s']} | {g['cpu_s']} |")
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "table": table, "bytes": {k: v[1] for k, v in sizes.items()}},
                                              indent=1))
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
