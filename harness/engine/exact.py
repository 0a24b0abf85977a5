"""Exact integer arithmetic for the synthetic models: the source of their batch invariance.

Every matrix product of the embedded models multiplies small integers (int8 activations and int8
weights) and accumulates them exactly: in int32 by oneDNN's int8 kernels on CPU (weights prepacked
once), or in float32 on other devices, where every partial sum is an integer below 2**24 and therefore
exact in any order. An exact sum does not depend on how a kernel splits the reduction, so a row's
result is bitwise the same whatever the batch around it: the property SGLang needs batch-invariant
kernels for. Products come out as float32 holding those exact integers.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

FLOAT_EXACT_LIMIT = 2**24  # integers up to this are exact in float32
LEVELS = 15  # quantised activations take values 0..LEVELS


def onednn_int8_available() -> bool:
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.onednn, "qlinear_prepack")


@dataclass
class IntLinear:
    """x @ W.T for integer x in [-max_input, max_input] and an int8 weight W [N, K] (out x in, the layout
    of torch.nn.Linear), exact, as float32. Build with `IntLinear.on(weight, device, max_input, signed)`
    from a CPU int8 tensor (not kept). Signed inputs are int8; unsigned ones (`signed=False`, values in
    [0, max_input]) are uint8.

    On CPU the weight is prepacked for oneDNN's u8 x s8 -> s32 kernel (signed inputs are shifted by
    `max_input` into u8 and the shift removed through the zero point); elsewhere a float32 copy is
    multiplied in float32.
    """

    in_features: int  # K
    out_features: int  # N
    max_input: int
    signed: bool
    packed: Tensor | None = None  # oneDNN's prepacked [N, K] weight (CPU)
    unit_scales: Tensor | None = None  # [N] ones: oneDNN's per-channel weight scales (CPU)
    zero_points: Tensor | None = None  # [N] zeros: oneDNN's weight zero points (CPU)
    weight_f32: Tensor | None = None  # [K, N] float32 copy (other devices)

    @classmethod
    def on(
        cls, weight: Tensor, device: torch.device, max_input: int, signed: bool = True, onednn: bool | None = None
    ) -> IntLinear:
        """Prepare `weight` [N, K] for `device`, checking that inputs up to max_input stay exact.

        onednn: use oneDNN's int8 kernel; None = whenever the device is the CPU and oneDNN has it.
        """
        if not 0 <= max_input <= (127 if signed else 255):
            raise ValueError(f"max_input {max_input} does not fit {'int8' if signed else 'uint8'} inputs")
        bound = max_input * _max_row_mass(weight)  # every partial sum is below max|x| * sum_k |w_nk|
        if bound >= FLOAT_EXACT_LIMIT:
            raise ValueError(f"an exact product needs max|x| * max_n sum_k |w_nk| < 2**24, got {bound}")
        n, k = weight.shape
        if onednn is None:
            onednn = device.type == "cpu" and onednn_int8_available()
        if onednn:
            packed = torch.ops.onednn.qlinear_prepack(weight.contiguous(), None)
            return cls(
                k,
                n,
                max_input,
                signed,
                packed=packed,
                unit_scales=torch.ones(n),
                zero_points=torch.zeros(n, dtype=torch.int64),
            )
        return cls(k, n, max_input, signed, weight_f32=weight.to(device).float().t())

    def __call__(self, x: Tensor) -> Tensor:
        """x: [M, K] int8 (uint8 if not signed) -> [M, N] float32 holding exact integers."""
        if self.weight_f32 is not None:  # not packed (other devices than the CPU)
            return x.float() @ self.weight_f32
        zero = self.max_input if self.signed else 0
        u8 = (x.to(torch.int16) + zero).to(torch.uint8) if self.signed else x.contiguous()  # [M, K]
        return torch.ops.onednn.qlinear_pointwise(
            u8, 1.0, zero, self.packed, self.unit_scales, self.zero_points, None, 1.0, 0, torch.float32, "none", [], ""
        )


def _max_row_mass(weight: Tensor, rows_per_chunk: int = 4096) -> int:
    """max over rows n of sum_k |w_nk| (int8 weights, |w| <= 127), a chunk of rows at a time."""
    if weight.numel() == 0:
        return 0
    if int(weight.min()) < -127:
        raise ValueError("int8 weights must be in [-127, 127]")
    return max(
        int(weight[i : i + rows_per_chunk].abs().sum(dim=1, dtype=torch.int32).max())
        for i in range(0, weight.shape[0], rows_per_chunk)
    )


def quantized_relu(y: Tensor, threshold: Tensor, step: Tensor) -> Tensor:
    """ceil((y - threshold) / step) clipped to [0, LEVELS].

    y: [M, N] float32 holding integers; threshold, step: [N] float32 integers (step >= 1).
    -> [M, N] uint8. Units with y <= threshold are silent (0); the others take 1..LEVELS.
    """
    return torch.ceil((y - threshold) / step).clamp_(0, LEVELS).to(torch.uint8)
