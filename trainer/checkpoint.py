"""Atomic checkpoints: the model, the optimizer's moments, its step and the learning-rate schedule
position in one MindSpore checkpoint, plus `state.json` (step, samples consumed, losses so far),
written into a temporary folder renamed into place, so a killed run never leaves half a checkpoint."""
from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Any, Optional

from corpusmill.stages.base import write_json_atomic

STEP_DIR = re.compile(r"^step-(\d{8})$")


def save(optimizer, out: Path, step: int, state: dict[str, Any], keep: int = 2) -> Path:
    import mindspore as ms

    root = out / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step-{step:08d}"
    tmp = root / f".tmp-step-{step:08d}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    ms.save_checkpoint(optimizer, str(tmp / "train.ckpt"))  # the optimizer holds the model's parameters too
    write_json_atomic(tmp / "state.json", {"step": step, **state}, indent=None)
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    for old in sorted(p for p in root.iterdir() if STEP_DIR.match(p.name))[:-keep]:
        shutil.rmtree(old)
    return final


def latest(out: Path) -> Optional[Path]:
    root = out / "checkpoints"
    found = sorted(p for p in root.iterdir() if STEP_DIR.match(p.name)) if root.is_dir() else []
    return found[-1] if found else None


def load(optimizer, folder: Path) -> dict[str, Any]:
    import mindspore as ms

    params = ms.load_checkpoint(str(folder / "train.ckpt"))
    not_loaded, _ = ms.load_param_into_net(optimizer, params, strict_load=True)
    if not_loaded:
        raise RuntimeError(f"checkpoint {folder} lacks {len(not_loaded)} parameters, e.g. {not_loaded[:3]}")
    return json.loads((folder / "state.json").read_text(encoding="utf-8"))
