"""Second-order statistics with spatial correlation, and the rules that carry them through modules.

The state of one (C, H, W) tensor, over the batch (:class:`Field`):

    m(c, p)      the mean at channel c, position p (a map: borders, the data's layout, MNIST's margins)
    v(c, p)      the variance there
    ρ(c, e)      the correlation at spatial lag e, for every lag of the map (2H−1, 2W−1), ρ(c, 0) = 1

    Cov(x_cp, x_c'q) = δ_cc' · √(v_cp v_cq) · ρ_c(q − p)

ASSUMPTIONS (the approximation, stated once): the centred field is a variance envelope √v times a
stationary correlation ρ (ρ does not depend on the position); channels are uncorrelated (as in
neural-tangents: cross-channel covariance 0; the input's own channels are made so, :func:`measure_input`)
but where their correlation is known, from the input's components through the rules that carry it
(``Field.chan``, ``chan_dc``: :mod:`channels`);
every value is Gaussian given its mean and variance where a nonlinear rule needs a distribution (but for
the two shapes carried: a max pool of a ReLU's output, the ReLU of a residual sum b + ReLU(y); and the
pointwise rules take a skewness and excess kurtosis where a conv of few inputs carries them, γ₁ and γ₂
per position (``Field.skew``, ``kurt``), through the Gram–Charlier density; the taps of a conv are
independent in its cumulants, and the joint law of two positions stays Gaussian).
``T(c, e) = Σ_p Cov(x_p, x_{p+e})``, the sum over the valid pairs, is what linear rules move;
``ρ = T / Σ_p √(v_p v_{p+e})`` turns it back into the state.

The rules, each from the module's actual weights, one file each (its equations in the file's docstring;
``sΔ`` there is the input lag of output lag Δ at stride s):

    conv.py     conv (and avg pools, the global pool: a box filter); timm's mixed conv as one conv
    positions.py  a field's covariance of positions (C, n, n), its moments; a depthwise conv through it on
                 small maps with large kernels (the cheaper road there)
    channels.py  the channels' correlation at lag 0 and of their sums, where known
    adaptive.py  an adaptive average pool of uneven, overlapping or repeated windows (a map up to 7 × 7)
    relu.py     ReLU (and of the residual sum b + ReLU(y))
    relu_dependence.py  the gradient's dependence on the value through a ReLU (closed form)
    relu_shape.py  ReLU of a skewed field (Gram–Charlier, closed form); its output's skewness, kurtosis
    joint.py    the joint cumulants of a depthwise conv's neighbouring outputs, and what they add to the
                lags of the activation after its norm
    pointwise.py  any other activation (ReLU6, SiLU, GELU, Hardswish, Hardsigmoid, sigmoid, tanh)
    maxpool.py  max pool (window draws, Clark's recursion)
    law.py      the law of a field that is not normal (atoms per position, a Gaussian copula): a sparse
                input's, through the first conv, the max pools, the norms, the adds, into the ReLUs
    regime.py   the regime per position that the channels share (a sparse input's background or
                strokes): moved exactly, a mixture at the adds and at the ReLUs where the law is dropped;
                back, the gradient's per-sample weights, each ReLU's gate read against them
    norms.py    GroupNorm, BatchNorm
    add.py      residual adds, the sum of two gradients
    linear.py   linear on (C, 1, 1) features
    flat_linear.py  linear on a flattened (C, H, W) map (AlexNet's and VGG's classifier)
    dropout.py  dropout (train and eval)
    cat.py      concatenation along channels
    pad.py      a map padded with a constant (F.pad; a conv's uneven 'same' padding)
    resample.py  a map resized (F.interpolate, nn.Upsample: any mode, torch's own position map), any
                 fixed map of the positions (pool(x) − x)
    scale.py    a product with a constant (layer scale, a multiply or divide by a number)
    shuffle.py  a channel shuffle (a permutation of the channels)
    split.py    some of the channels (a piece of a chunk or split, a slice x[:, a:b])
    layernorm.py  LayerNorm over the channels at each position (channels-last, LayerNorm2d, tokens)
    stochastic_depth.py  stochastic depth (a sample's whole branch dropped; train and eval)
    gate.py     x · s with s a per-sample, per-channel gate (squeeze-and-excitation)
    coupling.py  the gradient's first-order response to the value through 1 × 1 convs (the gate's Σ_p g x)
    shift.py    a sum with a constant (a position embedding)
    tokens.py   positions flattened into tokens and back into a map, a constant token set beside them, one
                token taken out
    attention.py  softmax self-attention over tokens (a first model: mixing weights near uniform)
    softmax_spread.py  the spread κ(s², T) of a softmax of T independent normal scores (exact, tabulated)
    product.py  a · b of two independent maps (StarNet's star, MambaOut's gated product)
    token_linear.py  a Linear over the tokens (MLP-Mixer's token MLP, ResMLP)
    mode_pad.py  a map padded by reflection, replication or wrapping (a blur pool's pad)
    space_to_depth.py  each block of positions into channels (TResNet's stem)
    conv_mlp.py  timm's VGG head (pooled up to its kernel, two convs)
    split_attn.py  timm's SplitAttn (ResNeSt: a gate over two halves of a conv's channels) whole
    stencil.py  a stride-1 map of border-dependent tap weights (an avg pool without count_include_pad,
                pool(x) − x) at any map size
    reparam.py  a re-parameterisable block's branches of one input folded into one conv (FastViT's RepMixer)
    squeeze_excite.py  squeeze-and-excitation as one step (inside a block whose rule is the whole block)
    window_attention.py  softmax attention within (shifted) windows of a map (Swin's), within the cells of
                a partition (MaxViT's block and grid), queried by a second input (GCViT's global query)
    spatial_reduction.py  attention whose keys and values come from the tokens' map reduced by a strided
                conv (PVT v2's)
    talking_heads.py  attention whose heads' scores and weights are mixed by Linears (CaiT's)
    class_attention.py  attention queried by the class token alone (CaiT's class attention, CrossViT's
                cross attention)
    regroup.py  a map's elements regrouped by reshapes and transposes (MobileViT's patches' tokens): the
                tensor's layout an index of the field's elements
    cell_attention.py  softmax attention within cells that partition a map's positions (MobileViT's
                sub-lattice of each in-patch offset)
    gpsa.py     gated positional self-attention (ConViT's: softmax attention and a constant positional
                attention per head, mixed by a gate)
    levit.py    LeViT's Linear-BatchNorm on tokens, its attention and its subsampling attention
    cross_covariance.py  cross-covariance attention over a head's channels (XCiT's, EdgeNeXt's XCA;
                DaViT's channel attention)
    draws.py    a step over Gaussian draws of its input from the state (a fixed seed), the state of draws
    drawn_attention.py  an attention's moments over draws of its q, k, v from the state, head by head
    linear_attention.py  EfficientViT-B0's LiteMLA (ReLU linear attention, its ratio over draws)
    cascaded_attention.py  EfficientViT-M's cascaded group attention in one window (over draws)
    factor_attention.py  CoaT's factorized attention and its convolutional relative position encoding
    branch_gain.py  a residual add whose branch is a function of the stream channel by channel: the
                cross term of the branch's linear gain
    tiny_vit.py  TinyViT's attention (a LayerNorm, qkv head by head, an offset bias) as a window
                attention on its block's map

Each rule file also registers the modules it is the rule of (``conv.py`` nn.Conv2d and timm's standardised
convs, ``norms.py`` the norms …: the adapter from a module's attributes to its step, beside the step);
``registry.py`` holds the registry (:func:`register_correlated_rule`, :func:`rule_for`) and ``steps.py``
the composition of steps and the identity. ``field.py`` holds the state and the lag helpers,
``normal.py`` the normal integrals, ``measure.py`` the measurement (the input's statistics, and a
tensor's for comparison). The walk through a model is :mod:`gatepool.analysis.probe.correlated_predict`.
"""

from gatepool.analysis.probe.correlated.adaptive import AdaptiveAvgPool, AvgPoolWindows
from gatepool.analysis.probe.correlated.add import add, add_grads
from gatepool.analysis.probe.correlated.attention import Attention
from gatepool.analysis.probe.correlated.branch_gain import add_cross, grad_cross, step_gain
from gatepool.analysis.probe.correlated.cascaded_attention import CascadedGroupAttention
from gatepool.analysis.probe.correlated.cat import Cat
from gatepool.analysis.probe.correlated.cell_attention import CellAttention
from gatepool.analysis.probe.correlated.class_attention import class_attention_rule, cross_attention_rule
from gatepool.analysis.probe.correlated.conv import Conv, autocorr, box_conv
from gatepool.analysis.probe.correlated.conv_mlp import AtLeast
from gatepool.analysis.probe.correlated.cross_covariance import CrossCovarianceAttention
from gatepool.analysis.probe.correlated.draws import Sampled
from gatepool.analysis.probe.correlated.dropout import Dropout
from gatepool.analysis.probe.correlated.factor_attention import FactorAttention
from gatepool.analysis.probe.correlated.field import Field, neighbour_corr, unit_noise, xcorr
from gatepool.analysis.probe.correlated.flat_linear import FlatLinear
from gatepool.analysis.probe.correlated.gate import Gate
from gatepool.analysis.probe.correlated.gpsa import GatedPositional
from gatepool.analysis.probe.correlated.law import conv_law, latent_corr, sum_law
from gatepool.analysis.probe.correlated.layernorm import LayerNorm
from gatepool.analysis.probe.correlated.levit import LinearNorm
from gatepool.analysis.probe.correlated.linear import Linear
from gatepool.analysis.probe.correlated.linear_attention import LinearAttention
from gatepool.analysis.probe.correlated.maxpool import MaxPool, clark_max
from gatepool.analysis.probe.correlated.measure import measure_field, measure_fields, measure_input
from gatepool.analysis.probe.correlated.mode_pad import MODES as PAD_MODES
from gatepool.analysis.probe.correlated.mode_pad import ModePad
from gatepool.analysis.probe.correlated.normal import (
    Law,
    bivariate_relu,
    relu_law,
    relu_moments_map,
    relu_of_sum_law,
    relu_of_sum_map,
)
from gatepool.analysis.probe.correlated.norms import BatchNorm, GroupNorm
from gatepool.analysis.probe.correlated.pad import Pad
from gatepool.analysis.probe.correlated.pointwise import Pointwise, hermite_coefficients
from gatepool.analysis.probe.correlated.product import Product
from gatepool.analysis.probe.correlated.registry import register_correlated_rule, rule_for
from gatepool.analysis.probe.correlated.regroup import Regrouped, map_index, regrouped
from gatepool.analysis.probe.correlated.relu import ReLU, relu_series_maps
from gatepool.analysis.probe.correlated.reparam import Reparam
from gatepool.analysis.probe.correlated.resample import Interpolate, PositionMap
from gatepool.analysis.probe.correlated.scale import Scale
from gatepool.analysis.probe.correlated.shift import Shift
from gatepool.analysis.probe.correlated.shuffle import ChannelShuffle
from gatepool.analysis.probe.correlated.space_to_depth import PatchMerging, SpaceToDepth
from gatepool.analysis.probe.correlated.spatial_reduction import SpatialReductionAttention
from gatepool.analysis.probe.correlated.split import ChannelSlice
from gatepool.analysis.probe.correlated.split_attn import SplitAttn
from gatepool.analysis.probe.correlated.squeeze_excite import SqueezeExcite
from gatepool.analysis.probe.correlated.stencil import Stencil, pool_stencil
from gatepool.analysis.probe.correlated.steps import Identity, Steps
from gatepool.analysis.probe.correlated.stochastic_depth import StochasticDepth
from gatepool.analysis.probe.correlated.talking_heads import TalkingHeads
from gatepool.analysis.probe.correlated.tiny_vit import NormedWindowAttention
from gatepool.analysis.probe.correlated.token_linear import TokenLinear
from gatepool.analysis.probe.correlated.tokens import (
    FlattenPositions,
    OnMap,
    SelectToken,
    TokenCat,
    TokenSlice,
    UnflattenPositions,
)
from gatepool.analysis.probe.correlated.window_attention import GlobalQueryWindowAttention, WindowAttention

__all__ = [
    "AdaptiveAvgPool",
    "AtLeast",
    "AvgPoolWindows",
    "Attention",
    "BatchNorm",
    "CascadedGroupAttention",
    "Cat",
    "CellAttention",
    "ChannelShuffle",
    "ChannelSlice",
    "Conv",
    "CrossCovarianceAttention",
    "Dropout",
    "FactorAttention",
    "Field",
    "FlatLinear",
    "FlattenPositions",
    "Gate",
    "GatedPositional",
    "GlobalQueryWindowAttention",
    "Identity",
    "GroupNorm",
    "Interpolate",
    "LayerNorm",
    "Linear",
    "LinearAttention",
    "LinearNorm",
    "MaxPool",
    "NormedWindowAttention",
    "OnMap",
    "ModePad",
    "PAD_MODES",
    "Pad",
    "PatchMerging",
    "Pointwise",
    "PositionMap",
    "Product",
    "ReLU",
    "Regrouped",
    "Reparam",
    "Scale",
    "SelectToken",
    "TokenSlice",
    "Shift",
    "SpaceToDepth",
    "SpatialReductionAttention",
    "SplitAttn",
    "SqueezeExcite",
    "Stencil",
    "Steps",
    "Sampled",
    "StochasticDepth",
    "TalkingHeads",
    "TokenCat",
    "TokenLinear",
    "UnflattenPositions",
    "WindowAttention",
    "add",
    "add_grads",
    "add_cross",
    "autocorr",
    "bivariate_relu",
    "class_attention_rule",
    "cross_attention_rule",
    "box_conv",
    "grad_cross",
    "map_index",
    "regrouped",
    "clark_max",
    "conv_law",
    "hermite_coefficients",
    "latent_corr",
    "measure_field",
    "measure_fields",
    "measure_input",
    "neighbour_corr",
    "pool_stencil",
    "relu_moments_map",
    "relu_of_sum_map",
    "relu_of_sum_law",
    "relu_law",
    "Law",
    "register_correlated_rule",
    "relu_series_maps",
    "rule_for",
    "step_gain",
    "sum_law",
    "unit_noise",
    "xcorr",
]
