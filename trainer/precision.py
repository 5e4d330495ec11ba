"""Mixed precision: the compute dtype for a device, and dynamic loss scaling for fp16.

fp16 has 5 exponent bits: small gradients underflow to zero unless the loss is multiplied by a
large scale before the backward pass, and too large a scale overflows to inf. The dynamic scaler
starts high, halves the scale and skips the step whenever a gradient is not finite, and doubles it
again after `window` finite steps in a row (as Megatron and MindSpore's DynamicLossScaleManager do).
bf16 has fp32's exponent range and needs no scaling, but MindSpore 2.10 has no bf16 CPU kernels.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


class PrecisionError(ValueError):
    """A precision the device cannot run."""


def compute_dtype(precision: str, device: str):
    import mindspore as ms

    if precision == "fp32":
        return ms.float32
    if precision == "fp16":
        return ms.float16
    if precision == "bf16":
        if device.upper() == "CPU":
            raise PrecisionError("train.precision bf16: MindSpore has no bf16 kernels on CPU; use fp16 (with loss "
                                 "scaling) or fp32 here, and bf16 on Ascend")
        return ms.bfloat16
    raise PrecisionError(f"train.precision {precision!r}: expected fp32, fp16 or bf16")


@dataclass
class DynamicLossScaler:
    scale: float = 2.0 ** 16
    window: int = 1000
    min_scale: float = 1.0
    good_steps: int = 0
    overflow_steps: int = 0
    consecutive_overflows: int = 0

    def update(self, finite: bool) -> None:
        """After a step: halve on overflow (the step was skipped), double after `window` finite steps."""
        if finite:
            self.good_steps += 1
            self.consecutive_overflows = 0
            if self.good_steps % self.window == 0:
                self.scale *= 2.0
            return
        self.overflow_steps += 1
        self.consecutive_overflows += 1
        self.good_steps = 0
        self.scale = max(self.min_scale, self.scale / 2.0)

    @property
    def stuck(self) -> bool:
        """Overflowing even at the smallest scale: the forward pass itself overflows (diverged)."""
        return self.scale <= self.min_scale and self.consecutive_overflows > 2

    def state(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> "DynamicLossScaler":
        return cls(**state)
