"""AdaptiveGatedPool1d/2d/3d: a gate over torch's adaptive windows, to any output size.

An adaptive pool fixes the output size O and lets the windows follow the input size L. Torch's rule, per
spatial dimension, for output index i ∈ [0, O):

    start_i = floor(i · L / O),   end_i = ceil((i + 1) · L / O),   window_i = [start_i, end_i)

so windows may differ in size by one and overlap (O > L repeats inputs). Each output is a gated sum over
its window, ``out_i = Σ_{j ∈ window_i} g_j · v_j``, with the gates of :mod:`gatepool.layers.gated_pool`:

    "max"           torch's ``F.adaptive_max_pool{d}d``                       —
    "avg"           torch's ``F.adaptive_avg_pool{d}d`` (g = 1/|window|)       —
    "soft"          softmax(v / τ) over the window, τ fixed                   —
    "soft-learned"  softmax(v / τ_c), one τ per channel, learned              log τ  (C,)
    "attention"     softmax(s / τ), s_j = x_j · w; values v_j = V x_j         score w (1×C), value V (C×C)

"conv" is not offered: it weighs fixed positions of one window size, and adaptive windows vary. The
parameters have ``GatedPool{d}d``'s names, shapes and start values. ``output_size`` is torch's: an int,
or a tuple with one entry per dimension, where None keeps that input size. This is the gated form of
``nn.AdaptiveAvgPool2d((7, 7))`` (VGG's head) or ``((6, 6))`` (AlexNet's); a window over the whole map
is :class:`gatepool.layers.global_pool.GlobalGatedPool2d`, which ``convert`` uses for output size 1.

Where the windows tile the input (every size a multiple of its output size: 56 → 7, VGG's 7 → 7), window
i is [i·k, (i + 1)·k) with k = n / o, a windowed pool's of kernel and stride k: on the CPU the soft family
takes :class:`gatepool.layers.gated_pool.GatedPoolNd`'s path there (the C kernel, float16 / bfloat16 read
as they are, float32 inside; without it the tiled or plain path, as
:func:`gatepool.layers.softmax_paths.softmax_path` names). Otherwise it gathers every window, padded to
the largest with masked taps (gate 0), into ``(N, C, *out, K)`` and takes the softmax there (max
pooling's limits for non-finite inputs, as every gate here), in float32 (float64 stays float64); the
output has the input's dtype. A float16 / bfloat16 input is gathered in float32 a chunk of samples at a
time (at most ``_HALF_CHUNK`` taps), and under autograd each chunk is checkpointed: nothing in float32 is
saved for the backward (the input itself is), which recomputes the chunk's windows and gates.
"""

from __future__ import annotations

import functools

import torch
from torch.utils.checkpoint import checkpoint

from gatepool.layers import gate_table
from gatepool.layers.gate_parameters import GateParameters
from gatepool.layers.gated_pool import GatedPoolNd
from gatepool.layers.softmax_paths import input_dtype, softmax_path
from gatepool.layers.windows import (
    as_dtype,
    channel_view,
    compute_dtype,
    like_input_format,
    pool_geometry,
    scale_scores,
    weighted_sum,
    window_softmax,
)

ADAPTIVE_GATES = gate_table.names(adaptive_form=True)  # ("max", "avg", "soft", "soft-learned", "attention")
_HALF_CHUNK = 1 << 22  # float16 / bfloat16 windows: at most this many taps gathered in float32 at once

__all__ = [
    "ADAPTIVE_GATES",
    "AdaptiveGatedPool1d",
    "AdaptiveGatedPool2d",
    "AdaptiveGatedPool3d",
    "AdaptiveGatedPoolNd",
    "adaptive_windows",
]


def adaptive_windows(size: int, out: int, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Torch's adaptive windows of ``size`` inputs into ``out`` outputs, padded to the widest, K.

    Returns ``index (out, K)`` (positions in ``[0, size)``; a padded tap repeats the window's start) and
    ``mask (out, K)`` (True at the window's own taps):
    ``start_i = ⌊i·size/out⌋``, ``end_i = ⌈(i+1)·size/out⌉``.
    """
    starts = [(i * size) // out for i in range(out)]
    ends = [-((-(i + 1) * size) // out) for i in range(out)]
    width = max(e - s for s, e in zip(starts, ends))
    taps = torch.arange(width, device=device)  # (K,)
    start = torch.tensor(starts, device=device)[:, None]  # (out, 1)
    mask = taps[None, :] < (torch.tensor(ends, device=device)[:, None] - start)  # (out, K)
    index = torch.where(mask, start + taps[None, :], start)
    return index, mask


class AdaptiveGatedPoolNd(GateParameters):
    """A gate over torch's adaptive windows in ``dim`` dimensions (use AdaptiveGatedPool1d / 2d / 3d).

    Args:
        output_size: an int ≥ 1, or a tuple of ``dim`` entries (each an int ≥ 1, or None: the input's size).
        gate: keyword, one of ``"max", "avg", "soft", "soft-learned", "attention"``.
        channels: C; required by the gates with weights ("soft-learned", "attention").
        temperature: τ > 0 of the soft gates (the start value for "soft-learned"); 1.0 for "max", "avg".
    """

    dim: int = 2
    return_weights = False  # read by the windowed gate functions (the tiling windows' path)

    def __init__(
        self,
        output_size: int | tuple[int | None, ...],
        *,
        gate: str,
        channels: int | None = None,
        temperature: float = 1.0,
    ) -> None:
        super().__init__()
        d = self.dim
        if gate not in gate_table.names(adaptive_form=True):
            known = gate in gate_table.names()
            hint = gate_table.row(gate).no_form_hint("adaptive windows vary in size") if known else ""
            adaptive = list(gate_table.names(adaptive_form=True))
            raise ValueError(f"gate={gate!r} has no adaptive form{hint}; choose one of {adaptive}")
        self.output_size = _check_output_size(output_size, d)
        self.init_gate(gate, channels, temperature)

    def extra_repr(self) -> str:
        return f"{self.output_size}, gate={self.gate!r}" + self.gate_repr()

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        """``(N, C, *spatial) -> (N, C, *output_size)``; unbatched ``(C, *spatial) -> (C, *output_size)``."""
        d = self.dim
        if not isinstance(input, torch.Tensor) or input.dim() not in (d + 1, d + 2):
            shape = tuple(input.shape) if isinstance(input, torch.Tensor) else type(input).__name__
            raise ValueError(
                f"input must be {d + 2}-D (N, C, *spatial) or {d + 1}-D (C, *spatial), got {shape}"
            )
        row = gate_table.row(self.gate)
        if row.torch:
            return row.torch_function(d, adaptive=True)(input, self.output_size)
        batched = input.dim() == d + 2
        xb = input if batched else input.unsqueeze(0)  # (N, C, *spatial)
        if self.channels is not None and xb.shape[1] != self.channels:
            raise ValueError(
                f"input has {xb.shape[1]} channels; this pool was built for channels={self.channels}"
            )
        size = tuple(n if o is None else o for n, o in zip(xb.shape[2:], self.output_size))
        path = softmax_path(xb, scored=row.scored, windows="adaptive", tiles=_tiles(xb.shape[2:], size))
        if path.name != "gather":  # the windows tile the input: a windowed pool's, k = s = n / o, its path
            k = tuple(n // o for n, o in zip(xb.shape[2:], size))
            x = as_dtype(xb, input_dtype(xb))  # the kernel's float16 / bfloat16 as they are
            out = getattr(GatedPoolNd, row.function)(self, x, pool_geometry(x, d, k, k))[0]
            out = as_dtype(like_input_format(out, xb), input.dtype)  # (attention's half output is float32)
            return out if batched else out.squeeze(0)
        windows, mask = _windows_of(tuple(xb.shape[2:]), size, xb.device)  # [(o_a, K_a)], (*out, K)
        if compute_dtype(xb.dtype) == xb.dtype:
            out = self._gathered(xb, windows, mask)
        else:  # float16 / bfloat16: float32 inside, a chunk of samples at a time, nothing of it saved
            taps = max(1, xb.shape[1] * mask.numel())  # C · ∏out · K: one sample's windows
            pool = self._gathered  # under autograd checkpointed: the backward recomputes a chunk's windows
            if torch.is_grad_enabled():
                pool = functools.partial(checkpoint, self._gathered, use_reentrant=False)
            outs = [pool(c, windows, mask) for c in xb.split(max(1, _HALF_CHUNK // taps))]
            out = outs[0] if len(outs) == 1 else torch.cat(outs)
        return out if batched else out.squeeze(0)

    def _gathered(self, xb: torch.Tensor, windows: list[torch.Tensor], mask: torch.Tensor) -> torch.Tensor:
        """``(N, C, *spatial) -> (N, C, *out)`` in ``xb``'s dtype: every window gathered, in float32 for
        float16 / bfloat16 (float64 stays), its gated sum."""
        row = gate_table.row(self.gate)
        x = xb.to(compute_dtype(xb.dtype))
        d = self.dim
        if row.scored:
            scores, tau = self.scores(x), self.fixed_temperature  # (N, 1, *spatial)
        else:
            scores, tau = x, self.temperature
            tau = channel_view(tau.to(x.dtype), d + 1) if isinstance(tau, torch.Tensor) else tau
        v = _gather(x, windows)  # (N, C, *out, K)
        s = v if scores is x else _gather(scores, windows)  # (N, 1 or C, *out, K)
        gates = window_softmax(scale_scores(s, tau), mask)
        out = weighted_sum(gates, v, mask)  # (N, C, *out)
        if row.scored:
            out = self.project(out)  # V · Σ_j g_j x_j = Σ_j g_j V x_j
        return out.to(xb.dtype)


@functools.lru_cache(maxsize=256)
def _cached_windows(sizes: tuple[int, ...], outs: tuple[int, ...], device: torch.device):
    with torch.inference_mode(False):  # usable by autograd whatever mode made them
        found = [adaptive_windows(n, o, device) for n, o in zip(sizes, outs)]  # (o_a, K_a) each
        return [w for w, _ in found], _outer_mask([m for _, m in found])


def _windows_of(
    sizes: tuple[int, ...], outs: tuple[int, ...], device: torch.device
) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Each axis's window index ``(o_a, K_a)`` and the mask ``(*out, K)`` of all: made once per sizes, output
    sizes and device (a compiled call makes its own), not at every call."""
    if torch.compiler.is_compiling():
        return _cached_windows.__wrapped__(sizes, outs, device)
    return _cached_windows(sizes, outs, device)


def _gather(x: torch.Tensor, windows: list[torch.Tensor]) -> torch.Tensor:
    """``(N, C, *spatial) -> (N, C, *out, K)``: the taps of every window, ``K = ∏ K_axis`` row-major."""
    d = len(windows)
    for axis, index in enumerate(windows):  # axis by axis: (…, n, …) -> (…, o, K_axis, …)
        at = 2 + 2 * axis  # the earlier axes are (o, K) pairs already
        o, k = index.shape
        x = x.index_select(at, index.flatten()).unflatten(at, (o, k))
    # (N, C, o_0, K_0, …, o_{d-1}, K_{d-1}) -> (N, C, o_0, …, o_{d-1}, K_0 … K_{d-1})
    order = [0, 1, *range(2, 2 + 2 * d, 2), *range(3, 3 + 2 * d, 2)]
    return x.permute(order).flatten(2 + d)


def _outer_mask(masks: list[torch.Tensor]) -> torch.Tensor:
    """Per-axis masks ``(o_a, K_a)`` -> ``(*out, K)``, K row-major as in :func:`_gather`."""
    d = len(masks)
    full = None
    for axis, m in enumerate(masks):
        shape = [1] * (2 * d)
        shape[axis], shape[d + axis] = m.shape
        m = m.view(shape)
        full = m if full is None else full & m
    return full.flatten(d)


def _tiles(sizes: tuple[int, ...], outs: tuple[int, ...]) -> bool:
    """Do torch's adaptive windows tile the input (each axis's size a multiple of its output size)? Then
    window i is [i·k, (i + 1)·k), k = n / o: a windowed pool's with kernel and stride k."""
    return all(n % o == 0 for n, o in zip(sizes, outs))


def _check_output_size(output_size, d: int) -> tuple[int | None, ...]:
    entries = (output_size,) * d if isinstance(output_size, int) else output_size
    ok = (
        isinstance(entries, (tuple, list))
        and len(entries) == d
        and all(o is None or (isinstance(o, int) and not isinstance(o, bool) and o >= 1) for o in entries)
    )
    if not ok or isinstance(output_size, bool):
        raise ValueError(
            f"output_size must be an int ≥ 1 or a tuple of {d} entries, each an int ≥ 1 or "
            f"None (the input's size), got {output_size!r}"
        )
    return tuple(entries)


class AdaptiveGatedPool1d(AdaptiveGatedPoolNd):
    """A gate over torch's adaptive windows of ``(N, C, L)`` or ``(C, L)``; see
    :class:`AdaptiveGatedPoolNd`."""

    dim = 1


class AdaptiveGatedPool2d(AdaptiveGatedPoolNd):
    """A gate over torch's adaptive windows of ``(N, C, H, W)`` or ``(C, H, W)``; see
    :class:`AdaptiveGatedPoolNd`."""

    dim = 2


class AdaptiveGatedPool3d(AdaptiveGatedPoolNd):
    """A gate over torch's adaptive windows of ``(N, C, D, H, W)``; see :class:`AdaptiveGatedPoolNd`."""

    dim = 3
