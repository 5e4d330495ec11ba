"""The training stage: exact resume, gradient accumulation, auto reader threads, lr-find (real MindSpore, CPU)."""
import json

import numpy as np
import pytest

from corpusmill.pipeline.config import parse_config
from corpusmill.pipeline.runner import Pipeline
from tests.corpora import build_corpus, e2e_config


@pytest.fixture(scope="module")
def shards(tmp_path_factory, dask_client):
    root = tmp_path_factory.mktemp("train")
    build_corpus(root / "corpus")
    cfg = parse_config(e2e_config(root / "corpus", shard={"ranks": 1, "files_per_rank": 2}))
    Pipeline(cfg, root / "out", client=dask_client, log=lambda m: None).run()
    return root / "out" / "shards", cfg


def _tcfg(cfg, **over):
    return cfg.train.model_copy(update={"num_parallel_workers": 1, **over})


def _losses(out):
    return [json.loads(x)["loss"] for x in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_interrupted_and_resumed_run_has_the_losses_of_an_uninterrupted_one(shards, tmp_path, precision):
    from corpusmill.trainer.train import train

    shards_dir, cfg = shards
    # fp16 from a scale that overflows for the first steps: the resumed run must restore the scaler too
    tcfg = _tcfg(cfg, steps=12, checkpoint_every=4, batch_size=4, precision=precision, loss_scale=2.0 ** 24)
    train(str(shards_dir), str(tmp_path / "whole"), tcfg, log=lambda m: None)
    first = train(str(shards_dir), str(tmp_path / "split"), tcfg, log=lambda m: None, stop_after=6)
    assert first["steps"] == 6 and (tmp_path / "split" / "checkpoints" / "step-00000006" / "state.json").is_file()
    assert not list((tmp_path / "split" / "checkpoints").glob(".tmp-*"))  # written atomically
    second = train(str(shards_dir), str(tmp_path / "split"), tcfg, log=lambda m: None, resume=True)
    assert second["resumed_at_step"] == 6 and second["steps"] == 12
    whole, split = _losses(tmp_path / "whole"), _losses(tmp_path / "split")
    assert len(split) == 12 and np.allclose(whole, split, rtol=0, atol=1e-6), (whole, split)
    if precision == "fp16":
        assert first["overflow_steps"] >= 1 and second["final_loss_scale"] == json.loads(
            (tmp_path / "whole" / "summary.json").read_text())["final_loss_scale"]
    assert sorted(p.name for p in (tmp_path / "split" / "checkpoints").iterdir()) == ["step-00000008", "step-00000012"]


def test_fp16_with_dynamic_loss_scaling_skips_overflowed_steps_and_tracks_fp32(shards, tmp_path):
    from corpusmill.trainer.train import train

    shards_dir, cfg = shards
    common = dict(steps=16, batch_size=4, lr=0.01)
    fp32 = train(str(shards_dir), str(tmp_path / "fp32"), _tcfg(cfg, **common), log=lambda m: None)
    logs: list[str] = []
    fp16 = train(str(shards_dir), str(tmp_path / "fp16"), _tcfg(cfg, precision="fp16", loss_scale=2.0 ** 20, **common),
                 log=logs.append)
    records = [json.loads(x) for x in (tmp_path / "fp16" / "metrics.jsonl").read_text().splitlines()]
    skipped = [r for r in records if r["overflow"]]
    assert fp16["precision"] == "fp16" and fp16["overflow_steps"] == len(skipped) >= 1
    assert fp16["final_loss_scale"] < 2.0 ** 20 and records[0]["loss_scale"] == 2.0 ** 20
    assert sum("gradient overflow" in m for m in logs) == len(skipped)
    # a skipped step does not move the schedule: the learning rate repeats after it
    first_skip = records.index(skipped[0])
    assert records[first_skip + 1]["lr"] == records[first_skip]["lr"]
    # it learns (16 steps on windows that mix sources: pack.shuffle_documents) and tracks fp32
    assert fp16["loss_end_mean"] < fp16["loss_start_mean"] - 0.25, fp16
    assert abs(fp16["last_loss"] - fp32["last_loss"]) < 0.05 * fp32["last_loss"], (fp16["last_loss"], fp32["last_loss"])


def test_bf16_is_refused_on_cpu_before_any_work(shards, tmp_path):
    from corpusmill.trainer.precision import PrecisionError
    from corpusmill.trainer.train import train

    shards_dir, cfg = shards
    with pytest.raises(PrecisionError, match="bf16.*CPU"):
        train(str(shards_dir), str(tmp_path / "bf16"), _tcfg(cfg, precision="bf16"), log=lambda m: None)
    assert not (tmp_path / "bf16" / "metrics.jsonl").exists()


def test_gradient_accumulation_equals_the_larger_batch(shards, tmp_path):
    from corpusmill.trainer.train import train

    shards_dir, cfg = shards
    big = train(str(shards_dir), str(tmp_path / "big"), _tcfg(cfg, steps=3, batch_size=8), log=lambda m: None)
    acc = train(str(shards_dir), str(tmp_path / "acc"), _tcfg(cfg, steps=3, batch_size=4, grad_accumulation=2),
                log=lambda m: None)
    assert np.allclose(_losses(tmp_path / "big"), _losses(tmp_path / "acc"), rtol=1e-4)
    assert acc["tokens"] == big["tokens"] and acc["grad_accumulation"] == 2


def test_auto_reader_threads_are_measured_then_cached(shards, tmp_path):
    from corpusmill.trainer.data import load_manifest, rank_files
    from corpusmill.trainer.workers import candidates, choose

    shards_dir, _ = shards
    files, sharding = rank_files(load_manifest(str(shards_dir)), str(shards_dir), 0)
    logs = []
    chosen, rates = choose(files, sharding, 4, str(shards_dir / "manifest.json"), log=logs.append,
                           cache=tmp_path / "cache.json")
    assert set(rates) == set(candidates(__import__("os").cpu_count())) and chosen in rates and all(r > 0 for r in rates.values())
    again, _ = choose(files, sharding, 4, str(shards_dir / "manifest.json"), log=logs.append, cache=tmp_path / "cache.json")
    assert again == chosen and "cached" in logs[-1]


def test_lr_find_suggests_a_rate_below_where_the_loss_blows_up_at_which_training_lowers_the_loss(shards, tmp_path):
    """Properties of the answer, not its formula: during the range test the loss got worse than at the
    start only above the suggestion, and a real run at the suggested rate lowers the loss."""
    import math

    from corpusmill.trainer.train import lr_find, train

    shards_dir, cfg = shards
    result = lr_find(str(shards_dir), _tcfg(cfg, batch_size=4), steps=30, log=lambda m: None)
    lrs, losses = result["lrs"], result["losses"]
    lowest = min(range(len(losses)), key=lambda i: losses[i] if math.isfinite(losses[i]) else math.inf)
    blown = [lr for lr, loss in zip(lrs[lowest:], losses[lowest:]) if not math.isfinite(loss) or loss > losses[0]]
    assert blown, "the range test never reached a rate at which the loss blows up, so it cannot tell where that is"
    assert result["suggested_lr"] < blown[0], (result["suggested_lr"], blown[0])
    run = train(str(shards_dir), str(tmp_path / "at-suggestion"),
                _tcfg(cfg, steps=20, batch_size=4, lr=result["suggested_lr"]), log=lambda m: None)
    assert run["loss_end_mean"] < run["loss_start_mean"] - 0.5, run


@pytest.mark.slow
def test_two_rank_data_parallel_under_msrun_ends_with_identical_parameters(tmp_path, dask_client):
    """msrun starts two real processes on CPU; each reads its own rank's files; gradients are all-reduced."""
    import os
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    import mindspore as ms

    root = tmp_path
    build_corpus(root / "corpus")
    cfg = parse_config(e2e_config(root / "corpus", shard={"ranks": 2, "files_per_rank": 1}))
    Pipeline(cfg, root / "out", client=dask_client, log=lambda m: None).run()
    (root / "cfg.yaml").write_text(cfg.to_yaml())
    msrun = shutil.which("msrun", path=str(Path(sys.executable).parent))
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", "GLOG_v": "3"}
    entry = Path(__file__).resolve().parents[1] / "pipeline" / "msrun_entry.py"  # as the README runs it
    import socket

    with socket.socket() as probe:  # a free port, so a busy 8118 on the CI host cannot fail the test
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    proc = subprocess.run([msrun, "--worker_num=2", "--local_worker_num=2", f"--master_port={port}", "--join=True",
                           f"--log_dir={root / 'logs'}", str(entry), "--shards", str(root / "out" / "shards"),
                           "--config", str(root / "cfg.yaml"), "--steps", "4", "--batch-size", "4",
                           "--checkpoint-every", "4", "--num-parallel-workers", "1", "--out", str(root / "train")],
                          capture_output=True, text=True, timeout=600, env=env, cwd=str(root))
    logs = "".join(p.read_text(errors="replace")[-2000:] for p in sorted((root / "logs").glob("*.log")))
    assert proc.returncode == 0, proc.stderr[-2000:] + logs
    params = [ms.load_checkpoint(str(root / "train" / f"rank-{r}" / "checkpoints" / "step-00000004" / "train.ckpt"))
              for r in (0, 1)]
    assert set(params[0]) == set(params[1]) and len(params[0]) > 10
    for name in params[0]:
        assert np.array_equal(params[0][name].asnumpy(), params[1][name].asnumpy()), name
    losses = [_losses(root / "train" / f"rank-{r}") for r in (0, 1)]
    assert losses[0] != losses[1]  # each rank trained on its own data
    summaries = [json.loads((root / "train" / f"rank-{r}" / "summary.json").read_text()) for r in (0, 1)]
    assert [s["rank"] for s in summaries] == [0, 1] and all(s["world_size"] == 2 for s in summaries)


def test_recompute_keeps_the_losses_and_a_profiler_window_writes_a_trace(shards, tmp_path):
    """The default step is one compiled graph; recompute runs op by op: the same losses either way."""
    from corpusmill.trainer.train import train

    shards_dir, cfg = shards
    plain_log: list[str] = []
    re_log: list[str] = []
    train(str(shards_dir), str(tmp_path / "plain"), _tcfg(cfg, steps=3, batch_size=4), log=plain_log.append)
    summary = train(str(shards_dir), str(tmp_path / "re"), _tcfg(cfg, steps=3, batch_size=4, recompute=True,
                                                                  profile_steps=(2, 3)), log=re_log.append)
    assert any("one compiled graph" in m for m in plain_log) and not any("compiled graph" in m for m in re_log)
    assert np.allclose(_losses(tmp_path / "plain"), _losses(tmp_path / "re"), rtol=1e-5)
    assert summary["recompute"] and summary["profile_dir"]
    assert any(p.is_file() for p in (tmp_path / "re" / "profile").rglob("*"))


def test_training_replaces_links_planted_in_its_output_folder_and_never_appends_through_one(shards, tmp_path):
    from corpusmill.trainer.train import train

    shards_dir, cfg = shards
    outside, out = tmp_path / "outside", tmp_path / "out"
    outside.mkdir()
    out.mkdir()
    (outside / "summary.json").write_text("precious")
    (out / "summary.json").symlink_to(outside / "summary.json")
    train(str(shards_dir), str(out), _tcfg(cfg, steps=2, batch_size=2), log=lambda m: None)
    assert (outside / "summary.json").read_text() == "precious"
    assert not (out / "summary.json").is_symlink() and json.loads((out / "summary.json").read_text())["steps"] == 2

    (outside / "metrics.jsonl").write_text("precious")
    linked = tmp_path / "linked"
    linked.mkdir()
    (linked / "metrics.jsonl").symlink_to(outside / "metrics.jsonl")
    with pytest.raises(OSError):  # O_NOFOLLOW: the CLI prints it as one line
        train(str(shards_dir), str(linked), _tcfg(cfg, steps=2, batch_size=2), log=lambda m: None)
    assert (outside / "metrics.jsonl").read_text() == "precious"


def test_resume_under_another_micro_batch_size_continues_at_the_same_sample(shards, tmp_path):
    """The memory plan may pick another micro-batch size at each start (it depends on free memory):
    a resumed run skips the samples consumed, not a count of batches, so its losses match."""
    from corpusmill.trainer.train import train

    shards_dir, cfg = shards
    whole = _tcfg(cfg, steps=4, batch_size=4, grad_accumulation=2, checkpoint_every=2)
    train(str(shards_dir), str(tmp_path / "whole"), whole, log=lambda m: None)
    train(str(shards_dir), str(tmp_path / "split"), whole, log=lambda m: None, stop_after=2)
    logs: list[str] = []
    train(str(shards_dir), str(tmp_path / "split"), _tcfg(cfg, steps=4, batch_size=2, grad_accumulation=4,
                                                           checkpoint_every=2), log=logs.append, resume=True)
    assert any("at step 2 (sample 16)" in line for line in logs)
    assert np.allclose(_losses(tmp_path / "whole"), _losses(tmp_path / "split"), rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="resume with --batch-size 2"):  # 32 samples do not split into 3s
        train(str(shards_dir), str(tmp_path / "split"), _tcfg(cfg, steps=4, batch_size=3, grad_accumulation=1,
                                                               checkpoint_every=2), log=lambda m: None, resume=True)
