"""The small end-to-end corpus most pipeline tests run on (originals, planted exact copies, junk,
malformed lines, a plain-text file) and the config they run it with; helpers, not tests."""
from __future__ import annotations

import gzip
import json
import random
from pathlib import Path

from tests.conftest import LENGTH_ONLY_FILTER, write_jsonl

WORDS = ("data model token corpus shard rank train window quality filter python river bread stone light "
         "garden winter music number letter window paper signal memory").split()
HANZI = "的一是在不了有和人这中大为上个国我以要他时来用们生到作地于出就分对成会可主发年动同工也能下过子说产种面而方后多定行学法所民得经十三之进着等部度家电力里如水化高自二理起小物现实加量都两体制机当使点从业本去把性好应开它合还因由其些然前外天政四日那社义事平形相全表间样与关各重新线内数正心反你明看原又么利比或但质气第向道命此变条只没结解问意建月公无系军很情者最立代想已通并提直题党程展五果料象员革位入常文总次品式活设及管特件长求老头基资边流路级少图山统接知较将组见计别她手角期根论运农指几九区强放决西被干做必战先回则任取据处队南给色光门即保治北造百规热领七海口东导器压志世金增争济阶油思术极交受联什认六共权收证改清己美再采转更单风切打白教速花带安场身车例真务具万每目至达走积示议声报斗完类八离华名确才科张信马节话米整空元况今集温传土许步群广石记需段研界拉林律叫且究观越织装影算低持音众书布复容儿须际商非验连断深难近矿千周委素技备半办青省列习响约支般史感劳便团往酸历市克何除消构府称太准精值号率族维划选标写存候毛亲快效斯院查江型眼王按格养易置派层片始却专状育厂京识适属圆包火住调满县局照参红细引听该铁价严"


def en_doc(rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(30, 90))) + "."


def zh_doc(rng: random.Random) -> str:
    return "".join(rng.choice(HANZI) for _ in range(rng.randint(40, 120))) + "。"


def build_corpus(root: Path) -> dict:
    """Originals in a.jsonl (file 0, so they have the lowest uids); copies in later files."""
    rng = random.Random(42)
    originals = [{"id": f"o{i}", "text": (en_doc if i % 2 else zh_doc)(rng), "source": "orig"} for i in range(240)]
    write_jsonl(root / "a.jsonl", originals, {10: b"{broken json\n", 20: b'{"text": 5}\n'})
    planted = []
    copies = []
    for k, i in enumerate(range(0, 240, 12)):
        text = originals[i]["text"]
        variant = text if k % 2 == 0 else "  " + text.replace(" ", "   ") + "\r\n"  # equal after normalisation
        copies.append({"id": f"copy{k}", "text": variant, "source": "copies"})
        planted.append((f"copy{k}", f"o{i}"))
    copies.append({"id": "copy-of-copy", "text": originals[0]["text"], "source": "copies"})
    planted.append(("copy-of-copy", "o0"))
    junk = [{"id": f"junk{k}", "text": t, "source": "junk"} for k, t in enumerate(["", "ok", "短", "!!!"])]
    with gzip.open(root / "b.jsonl.gz", "wb") as f:
        for rec in copies + junk:
            f.write(json.dumps(rec, ensure_ascii=False).encode() + b"\n")
        f.write(b'{"text": "caf\xe9"}\n')
    (root / "c.txt").write_text(en_doc(rng), encoding="utf-8")
    return {"planted": set(planted), "junk": {r["id"] for r in junk}, "malformed": 3, "originals": len(originals)}


def e2e_config(corpus: Path, **over) -> dict:
    cfg = {
        "input": {"paths": [str(corpus)], "part_size_mb": 0.01, "block_size_mb": 0.02},  # many blocks and parts
        "filter": {"length": {"min_chars": 10}, **LENGTH_ONLY_FILTER},
        "tokenizer": {"train": {"vocab_size": 1500}},
        "pack": {"seq_length": 32},
        "shard": {"ranks": 2, "files_per_rank": 2, "seed": 7},
        "train": {"steps": 30, "batch_size": 8, "lr": 0.005, "model": {"hidden_size": 64, "num_layers": 2, "num_heads": 4}},
    }
    for key, value in over.items():
        cfg[key] = {**cfg.get(key, {}), **value}
    return cfg


def service_config(corpus: Path, **over) -> dict:
    """The e2e test config with the corpus named relative to the data root, as an API user would."""
    return e2e_config(corpus, input={"paths": ["corpus"], "part_size_mb": 0.02, "block_size_mb": 0.04}, **over)


# ---- a corpus in two halves: dedup of the second against the first (dedup.reference) ----

def reference_halves(root: Path) -> tuple[Path, Path]:
    """Half A, and half B holding new documents, exact and near copies of A's, and a copy within B."""
    rng = random.Random(7)
    base = [(en_doc if i % 2 else zh_doc)(rng) for i in range(80)]

    def near(text: str) -> str:
        words = text.split(" ")
        words[3] = "zzz"
        return " ".join(words)

    a = [{"id": f"a{i}", "text": base[i], "source": "A"} for i in range(40)] + [{"id": "a-dup0", "text": base[0]}]
    b = [{"id": f"b{i}", "text": base[40 + i], "source": "B"} for i in range(40)]
    b += [{"id": f"b-exact{i}", "text": base[i], "source": "B"} for i in range(0, 16, 4)]
    b += [{"id": f"b-near{i}", "text": near(base[i]), "source": "B"} for i in range(1, 16, 4)]  # odd: English
    b += [{"id": "b-dup40", "text": base[40], "source": "B"}]
    return write_jsonl(root / "a.jsonl", a), write_jsonl(root / "b.jsonl", b)


def dedup_run(paths: list[Path], out: Path, client, **dedup) -> Path:
    """A dedup job over `paths` into `out` on the session's cluster (MinHash threshold 0.7 unless given)."""
    from corpusmill.pipeline.config import parse_config
    from corpusmill.pipeline.runner import Pipeline

    cfg = parse_config({"input": {"paths": [str(p) for p in paths]}, "dedup": {"minhash": {"threshold": 0.7}, **dedup}})
    Pipeline(cfg, out, client=client, log=lambda m: None, job="dedup").run()
    return out


# ---- word salad for the service and jobs-client tests ----

SALAD = [f"w{i}" for i in range(4000)]  # 4,000 distinct tokens: no near duplicates by accident


def write_small_corpus(folder: Path, files: int = 4, docs: int = 20, ids: str = "d") -> int:
    """`files` JSONL files of word salad, each document's first copy in the first file: several read tasks
    (so the progress lines carry an ETA) and exact duplicates for the ledger to count. Returns documents written."""
    rng = random.Random(7)
    folder.mkdir(parents=True, exist_ok=True)
    texts = [" ".join(rng.choices(SALAD, k=60)) for _ in range(docs)]
    written = 0
    for f in range(files):
        with open(folder / f"part-{f}.jsonl", "w", encoding="utf-8") as out:
            for i, text in enumerate(texts if f == 0 else texts[f::3]):
                out.write(json.dumps({"id": f"{ids}{f}-{i}", "text": text}, ensure_ascii=False) + "\n")
                written += 1
    return written


def write_long_corpus(folder: Path, files: int = 24, docs_per_file: int = 3000) -> None:
    """~40 MB of distinct documents in many files: a dedup job that runs for a while in short tasks, so
    cancelling it frees the worker at once."""
    rng = random.Random(11)
    folder.mkdir(parents=True, exist_ok=True)
    lines = [" ".join(rng.choices(SALAD, k=90)) for _ in range(500)]
    for f in range(files):
        with open(folder / f"long-{f:02d}.jsonl", "w") as out:
            for i in range(docs_per_file):
                out.write(json.dumps({"id": f"l{f}-{i}", "text": f"{lines[(i * 7 + f) % 500]} u{f}x{i}"}) + "\n")
