"""Residual adds and the sum of a tensor's two gradients.

add       x + f(x): the two independent (the stream–branch cross term is zero in expectation over
          the branch's zero-mean last weights: it is not carried); T and v add. Back: the same.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from gatepool.analysis.probe.correlated import centred, regime
from gatepool.analysis.probe.correlated.channels import add_channels, made_of
from gatepool.analysis.probe.correlated.coupling import added_coupling
from gatepool.analysis.probe.correlated.field import Field, _field_from_sums


def add(a: Field, b: Field) -> Field:
    """a + b, the two independent: means, variances and lag sums add (and the channels' covariances,
    :func:`channels.add_channels`)."""
    out = _field_from_sums(a.mean + b.mean, a.var + b.var, a.lag_sums() + b.lag_sums())
    out.chan, out.chan_dc = add_channels(a, b)
    for x, c in ((a, b), (b, a)):  # x plus a constant (a branch whose last weights are 0 at init)
        if made_of(x) is not None and not bool((c.var > 0).any()):
            out.made = replace(x.made, var=out.var)
    return out


def add_grads(a: Field, b: Field) -> Field:
    """Two gradients of one tensor, independent: variances, lag sums and ``yy`` add (``yy`` is kept
    only where both have it), the per-sample weights joined (:func:`regime.join`); a signed cross term
    either carries (``Field.cross``: a residual add's with its branch's gradient) is added to the sum."""
    yy = None if a.yy is None or b.yy is None else a.yy + b.yy
    var, T = a.var + b.var, a.lag_sums() + b.lag_sums()
    for v, t in (f.cross for f in (a, b) if f.cross is not None):
        var, T = var + v, T + t
    out = _field_from_sums(torch.zeros_like(a.var), var, T, yy)
    out.coupling = added_coupling(a.coupling, b.coupling)
    out.weight = regime.join(a.weight, a.var, b.weight, b.var)
    out.centred = centred.added(a, b)
    return out
