/* gatepool::softmax_pool_eager: the C kernels of softmax_pool.c as one torch operator whose autograd is in
   C++, for eager calls on the CPU (fused_pool.eager says when; fused_pool.py has the equations).

       softmax_pool_eager(Tensor values, Tensor? scores, Tensor tau, int[] geometry,
                          Tensor? projection=None, bool log_tau=False) -> Tensor

   values (N, C, *spatial) in any memory format; scores None (soft pooling, s = v), a score map
   (N, 1, *spatial) or score weights (C); tau (1) or (C), the weights and tau taken in the compute type
   (float32 for float16 / bfloat16 values, as the kernels' a = 1/τ; converted here), or with log_tau its
   log (the learned gate's parameter log τ: a = 1/exp(log τ) here and its gradient ∂L/∂log τ = −∂L/∂a · a,
   so the parameter's exp is no node of its own); geometry as fused_pool.encode writes it; projection, with score weights only (then
   given as (C) or as the score's 1×1 convolution weight (1, C, 1, …): no view of the parameter), the
   attention gate's value matrix V (C, C) or its 1×1 convolution's weight (C, C, 1, …): out = V · pooled
   at each output position (the gates sum to 1, so this is Σ_j g_j V v_j; gate_parameters.py), where
   no window is empty. Out (N, C, *out) in values' memory format.

   Without a projection it makes the same kernel calls on the same operands as the Python op
   gatepool::softmax_pool and its autograd formula (fused_pool.py), so the values and gradients are the
   op's bit for bit; the projection is the op's 1×1 convolution up to rounding. What it saves is the
   interpreter between them, and the nodes and dispatcher calls of exp(log τ) and of the convolution: a
   small input's call is mostly that (issue 44: the per-call cost of a (2, 8, 4, 4) pool). One dispatcher
   call forward; the backward is a node that autograd's engine runs without Python. A backward that must
   itself be differentiable (create_graph=True) calls gatepool::softmax_pool_vjp, which fused_pool.py
   defines: autograd through the plain path. */

#include <algorithm>
#include <cstring>

#include <ATen/core/Tensor.h>
#include <ATen/Parallel.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/exp.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/zeros.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

#include "softmax_pool.h"

namespace {


using Forward = int64_t (*)(const gp_geometry *, const gp_tensors *, int);
using Backward = void (*)(const gp_geometry *, const gp_tensors *, int);

/* float16 / bfloat16 are computed in float32 (a, w, stats and the τ and w gradients in it). */
at::ScalarType compute_type(at::ScalarType t) { return t == at::kDouble ? at::kDouble : at::kFloat; }

std::pair<Forward, Backward> kernels(at::ScalarType t) {
    switch (t) {
    case at::kFloat: return {softmax_pool_forward_f32, softmax_pool_backward_f32};
    case at::kDouble: return {softmax_pool_forward_f64, softmax_pool_backward_f64};
    case at::kHalf: return {softmax_pool_forward_f16, softmax_pool_backward_f16};
    case at::kBFloat16: return {softmax_pool_forward_bf16, softmax_pool_backward_bf16};
    default: TORCH_CHECK(false, "softmax_pool_eager: values must be float16, bfloat16, float32 or float64, got ", t);
    }
}

/* Is t (N, C, *S) dense in channels-last memory, t.movedim(1, -1).is_contiguous()? From its strides. */
bool channels_last_memory(const at::Tensor &t) {
    int64_t expected = 1;
    auto dense = [&](int64_t i) {
        if (t.size(i) != 1 && t.stride(i) != expected) return false;
        expected *= t.size(i);
        return true;
    };
    if (!dense(1)) return false;
    for (int64_t i = t.dim() - 1; i >= 2; --i)
        if (!dense(i)) return false;
    return dense(0);
}

/* Up to this many elements a layout change is a plain loop here: at::Tensor::contiguous costs a small
   tensor more than its copy (the per-call cost of a small pool); above it, ATen's parallel copy. */
constexpr int64_t SMALL = 1 << 15;

/* dst[n][s][c] = src[n][c][s] (to_last) or the reverse, for contiguous (N, C, S) / (N, S, C) memory. */
template <typename E>
void transpose(const E *src, E *dst, int64_t n, int64_t c, int64_t s, bool to_last) {
    for (int64_t b = 0; b < n; ++b, src += c * s, dst += c * s)
        for (int64_t i = 0; i < c; ++i)
            for (int64_t j = 0; j < s; ++j) {
                if (to_last) dst[j * c + i] = src[i * s + j];
                else dst[i * s + j] = src[j * c + i];
            }
}

void transpose(const at::Tensor &src, at::Tensor &dst, bool to_last) {
    const int64_t n = src.size(0), c = to_last ? src.size(1) : src.size(-1), s = src.numel() / std::max<int64_t>(n * c, 1);
    switch (src.element_size()) {
    case 2: transpose((const int16_t *)src.data_ptr(), (int16_t *)dst.data_ptr(), n, c, s, to_last); break;
    case 4: transpose((const int32_t *)src.data_ptr(), (int32_t *)dst.data_ptr(), n, c, s, to_last); break;
    default: transpose((const int64_t *)src.data_ptr(), (int64_t *)dst.data_ptr(), n, c, s, to_last);
    }
}

/* The sizes with dimension 1 moved last, (N, C, *S) -> (N, *S, C), or (to_last false) back. */
std::vector<int64_t> moved(at::IntArrayRef sizes, bool to_last) {
    std::vector<int64_t> out(sizes.begin(), sizes.end());
    if (to_last) std::rotate(out.begin() + 1, out.begin() + 2, out.end());
    else std::rotate(out.begin() + 1, out.end() - 1, out.end());
    return out;
}

/* (N, C, *S) as channels-last memory (N, *S, C), contiguous: a view where it is there already (a small
   NCHW tensor's copy made without one: a view costs a small call three dispatches). */
at::Tensor last(const at::Tensor &t) {
    if (channels_last_memory(t)) return t.movedim(1, -1);
    if (t.numel() > SMALL || !t.is_contiguous()) return t.movedim(1, -1).contiguous();
    at::Tensor out = at::empty(moved(t.sizes(), true), t.options());
    transpose(t, out, true);
    return out;
}

/* Kernel layout (N, *S, C) back to (N, C, *S), in like's memory format. */
at::Tensor like(const at::Tensor &y, const at::Tensor &like) {
    if (channels_last_memory(like)) return y.movedim(-1, 1);
    if (y.numel() > SMALL) return y.movedim(-1, 1).contiguous();
    at::Tensor dense = at::empty(moved(y.sizes(), false), y.options());
    transpose(y, dense, false);
    return dense;
}

template <typename T>
void tau_gradient(const T *sum, const T *a, T *g, int64_t n, bool log_tau) {
    for (int64_t i = 0; i < n; ++i) {
        T x = -sum[i] * a[i];
        g[i] = log_tau ? x : x * a[i];
    }
}

/* ∂L/∂τ = −∂L/∂a / τ² = (−Σ ∂L/∂a) a a, or ∂L/∂log τ = ∂L/∂τ τ = (−Σ ∂L/∂a) a, from the per-thread rows
   ga (threads, CA): the Python op's operations in its order, in a loop (no small ops on a small input). */
at::Tensor tau_gradient(const at::Tensor &ga, const at::Tensor &a, bool log_tau) {
    const at::Tensor sum = ga.size(0) == 1 ? ga : ga.sum(0);  // contiguous, CA entries
    at::Tensor g = at::empty({a.numel()}, a.options());
    if (a.scalar_type() == at::kDouble)
        tau_gradient(sum.data_ptr<double>(), a.data_ptr<double>(), g.data_ptr<double>(), a.numel(), log_tau);
    else
        tau_gradient(sum.data_ptr<float>(), a.data_ptr<float>(), g.data_ptr<float>(), a.numel(), log_tau);
    return g;
}

/* t, contiguous, in the compute type: itself where it is already (no dispatch). */
at::Tensor in_type(const at::Tensor &t, at::ScalarType type) {
    return t.scalar_type() == type && t.is_contiguous() ? t : t.to(type).contiguous();
}

/* a = 1/τ (CA) in the compute type t: an IEEE division per entry, as at::reciprocal's; with log_tau, τ is
   at::exp of the given log τ (as the Python op's torch.exp: the same kernel, bit for bit). */
at::Tensor inverse(const at::Tensor &tau, at::ScalarType t, bool log_tau) {
    at::Tensor tt = in_type(tau, t);
    if (log_tau) tt = at::exp(tt);
    at::Tensor a = at::empty({tt.numel()}, tt.options());
    if (t == at::kDouble) {
        const double *p = tt.data_ptr<double>();
        for (int64_t i = 0; i < tt.numel(); ++i) a.data_ptr<double>()[i] = 1.0 / p[i];
    } else {
        const float *p = tt.data_ptr<float>();
        for (int64_t i = 0; i < tt.numel(); ++i) a.data_ptr<float>()[i] = 1.0f / p[i];
    }
    return a;
}

/* Up to this many multiply-adds a projection is a plain loop here: at::mm costs a small product more than
   its arithmetic (the per-call cost of a small pool); above it, ATen's matrix product. */
constexpr int64_t SMALL_PRODUCT = 1 << 16;

/* z_r = M x_r (transposed false) or Mᵀ x_r (true) for the rows x_r of x (R, C); M (C, C), row-major. */
template <typename T>
void rows_times(const T *x, const T *m, T *z, int64_t rows, int64_t c, bool transposed) {
    for (int64_t r = 0; r < rows; ++r, x += c, z += c)
        for (int64_t i = 0; i < c; ++i) {
            T sum = 0;
            for (int64_t k = 0; k < c; ++k) sum += (transposed ? m[k * c + i] : m[i * c + k]) * x[k];
            z[i] = sum;
        }
}

/* g = Σ_r y_r ⊗ x_r, g[i][k] = Σ_r y_r[i] x_r[k], for the rows of y and x (R, C): (C, C), row-major. */
template <typename T>
void outer_sum(const T *y, const T *x, T *g, int64_t rows, int64_t c) {
    std::fill(g, g + c * c, T(0));
    for (int64_t r = 0; r < rows; ++r, x += c, y += c)
        for (int64_t i = 0; i < c; ++i)
            for (int64_t k = 0; k < c; ++k) g[i * c + k] += y[i] * x[k];
}

/* M x_r (or Mᵀ x_r, transposed) for each row of x (*, C), contiguous; m (C, C, 1…) contiguous, x's dtype. */
at::Tensor times(const at::Tensor &x, const at::Tensor &m, bool transposed) {
    const int64_t c = x.size(-1), rows = x.numel() / std::max<int64_t>(c, 1);
    if (rows * c * c > SMALL_PRODUCT) {
        const at::Tensor m2 = m.view({c, c});
        return at::mm(x.view({rows, c}), transposed ? m2 : m2.t()).view(x.sizes());
    }
    at::Tensor z = at::empty(x.sizes(), x.options());
    if (x.scalar_type() == at::kDouble)
        rows_times(x.data_ptr<double>(), m.data_ptr<double>(), z.data_ptr<double>(), rows, c, transposed);
    else
        rows_times(x.data_ptr<float>(), m.data_ptr<float>(), z.data_ptr<float>(), rows, c, transposed);
    return z;
}

/* Σ_r y_r ⊗ x_r for the rows of y and x (*, C), contiguous: shaped as like (C, C, 1…), in x's dtype. */
at::Tensor outer(const at::Tensor &y, const at::Tensor &x, const at::Tensor &like) {
    const int64_t c = x.size(-1), rows = x.numel() / std::max<int64_t>(c, 1);
    if (rows * c * c > SMALL_PRODUCT) return at::mm(y.view({rows, c}).t(), x.view({rows, c})).view(like.sizes());
    at::Tensor g = at::empty(like.sizes(), x.options());
    if (x.scalar_type() == at::kDouble)
        outer_sum(y.data_ptr<double>(), x.data_ptr<double>(), g.data_ptr<double>(), rows, c);
    else
        outer_sum(y.data_ptr<float>(), x.data_ptr<float>(), g.data_ptr<float>(), rows, c);
    return g;
}

/* The C geometry of fused_pool.encode's list, for values (N, C, *S) with cs score channels and ca temperatures. */
gp_geometry decode(at::IntArrayRef geometry, const at::Tensor &values, int64_t cs, int64_t ca) {
    const int64_t d = geometry.empty() ? 0 : geometry[0];
    TORCH_CHECK(d >= 1 && d <= 3 && (int64_t)geometry.size() == 6 * d + 2 && values.dim() == d + 2,
                "softmax_pool_eager: geometry must be fused_pool.encode's of a ", values.dim() - 2,
                "-D pool, got ", geometry);
    gp_geometry g{values.size(0), values.size(1), cs, ca};
    for (int64_t i = 0; i < 3; ++i) {  // 1-D and 2-D pools lead with sizes 1, padding 0
        const int64_t j = i - (3 - d);
        const bool lead = j < 0;
        g.kernel[i] = lead ? 1 : geometry[1 + j];
        g.stride[i] = lead ? 1 : geometry[1 + d + j];
        g.padding[i] = lead ? 0 : geometry[1 + 2 * d + j];
        g.dilation[i] = lead ? 1 : geometry[1 + 3 * d + j];
        g.in_size[i] = lead ? 1 : geometry[1 + 4 * d + j];
        g.out_size[i] = lead ? 1 : geometry[1 + 5 * d + j];
    }
    return g;
}

/* One call's operands, as the Python op's _operands makes them: the C geometry and the kernel's views
   (values and the score map in channels-last memory, the score weights, a = 1/τ), and the projection V in
   the compute type. The forward makes them (make); the backward takes the forward's, saved. */
struct Pool {
    gp_geometry g;
    at::Tensor v, s, w, a;  // s: the score map (v itself for soft pooling), or undefined with weights w
    at::Tensor p;           // the projection V (C, C, 1…), or undefined

    static Pool make(const at::Tensor &values, const std::optional<at::Tensor> &scores, const at::Tensor &tau,
                     at::IntArrayRef geometry, const std::optional<at::Tensor> &projection, bool log_tau) {
        const bool weights = scores.has_value() && (scores->dim() == 1 || projection.has_value());
        TORCH_CHECK(!weights || scores->numel() == values.size(1), "softmax_pool_eager: score weights must have C = ",
                    values.size(1), " entries, got ", scores->sizes());
        const int64_t cs = weights ? 1 : scores.has_value() ? scores->size(1) : values.size(1);
        const at::ScalarType t = compute_type(values.scalar_type());
        at::Tensor v = last(values), p;
        if (projection.has_value()) {
            TORCH_CHECK(weights && projection->dim() >= 2 && projection->numel() == values.size(1) * values.size(1)
                            && projection->size(0) == values.size(1),
                        "softmax_pool_eager: projection must be V (C, C, 1…) with score weights (C), got ",
                        projection->sizes());
            p = in_type(*projection, t);
        }
        return {decode(geometry, values, cs, tau.numel()), v,
                !scores.has_value() ? v : weights ? at::Tensor() : last(*scores),
                weights ? in_type(*scores, t) : at::Tensor(), inverse(tau, t, log_tau), p};
    }

    at::ScalarType out_type() const { return w.defined() ? a.scalar_type() : v.scalar_type(); }

    /* out (N, *out, C) and stats (2, N, *out, CS). */
    std::pair<at::Tensor, at::Tensor> forward() const {
        std::vector<int64_t> shape{g.n};
        for (int64_t i = 3 - (v.dim() - 2); i < 3; ++i) shape.push_back(g.out_size[i]);
        std::vector<int64_t> stats_shape{2};
        stats_shape.insert(stats_shape.end(), shape.begin(), shape.end());
        shape.push_back(g.c);
        stats_shape.push_back(g.cs);
        at::Tensor out = at::empty(shape, v.options().dtype(out_type()));
        at::Tensor stats = at::empty(stats_shape, a.options());
        gp_tensors ts{v.data_ptr(), s.defined() ? s.data_ptr() : nullptr, a.data_ptr(),
                      w.defined() ? w.data_ptr() : nullptr, out.data_ptr(), stats.data_ptr()};
        kernels(v.scalar_type()).first(&g, &ts, at::get_num_threads());
        return {out, stats};
    }

    /* (∂L/∂values, ∂L/∂scores, ∂L/∂τ or ∂L/∂log τ) in the kernel's layouts, undefined where not asked
       for; go: ∂L/∂out in the kernel's layout. */
    std::tuple<at::Tensor, at::Tensor, at::Tensor> backward(const at::Tensor &out, const at::Tensor &stats,
                                                            const at::Tensor &go, bool score_map, bool need_tau,
                                                            bool log_tau) const {
        const int threads = at::get_num_threads();
        at::Tensor gv = at::empty(v.sizes(), v.options());  // v, s: contiguous
        at::Tensor gs = score_map ? at::empty(s.sizes(), s.options()) : at::Tensor();
        at::Tensor ga = need_tau ? at::empty({threads, g.ca}, a.options()) : at::Tensor();
        if (need_tau) std::memset(ga.data_ptr(), 0, ga.nbytes());  // the kernel adds into its thread's row
        at::Tensor gw;  // (threads, C), each row zeroed there; at one thread as w itself (its one row)
        if (w.defined()) gw = threads == 1 ? at::empty(w.sizes(), a.options()) : at::empty({threads, g.c}, a.options());
        gp_tensors ts{v.data_ptr(), s.defined() ? s.data_ptr() : nullptr, a.data_ptr(),
                      w.defined() ? w.data_ptr() : nullptr, out.data_ptr(), stats.data_ptr(), go.data_ptr(),
                      gv.data_ptr(), gs.defined() ? gs.data_ptr() : nullptr,
                      ga.defined() ? ga.data_ptr() : nullptr, gw.defined() ? gw.data_ptr() : nullptr};
        kernels(v.scalar_type()).second(&g, &ts, threads);
        at::Tensor grad_scores = !w.defined() ? gs : threads == 1 ? gw : gw.sum(0).view(w.sizes());  // ∂L/∂w, ∂L/∂s
        at::Tensor grad_tau = need_tau ? tau_gradient(ga, a, log_tau) : at::Tensor();
        return {gv, grad_scores, grad_tau};
    }
};

at::Tensor softmax_pool_cpu(const at::Tensor &values, const std::optional<at::Tensor> &scores,
                            const at::Tensor &tau, at::IntArrayRef geometry,
                            const std::optional<at::Tensor> &projection, bool log_tau) {
    const Pool pool = Pool::make(values, scores, tau, geometry, projection, log_tau);
    const at::Tensor pooled = pool.forward().first;
    return like(pool.p.defined() ? times(pooled, pool.p, false) : pooled, values);
}

}  // namespace

namespace gatepool {

/* The autograd node's name: torch::autograd::CppNode<gatepool::SoftmaxPoolEager>. */
struct SoftmaxPoolEager : public torch::autograd::Function<SoftmaxPoolEager> {
    static at::Tensor forward(torch::autograd::AutogradContext *ctx, const at::Tensor &values,
                              const std::optional<at::Tensor> &scores, const at::Tensor &tau,
                              std::vector<int64_t> geometry, const std::optional<at::Tensor> &projection,
                              bool log_tau) {
        Pool pool = Pool::make(values, scores, tau, geometry, projection, log_tau);
        auto [pooled, stats] = pool.forward();  // pooled: the kernel's out, which its backward reads
        ctx->save_for_backward({values, scores.value_or(at::Tensor()), tau, pool.v, pool.s, pool.a, pooled, stats,
                                projection.value_or(at::Tensor()), pool.p});
        ctx->saved_data["geometry"] = std::move(geometry);
        ctx->saved_data["log_tau"] = log_tau;
        return like(pool.p.defined() ? times(pooled, pool.p, false) : pooled, values);  // V · pooled
    }

    static torch::autograd::variable_list backward(torch::autograd::AutogradContext *ctx,
                                                  torch::autograd::variable_list grads) {
        torch::autograd::variable_list saved = ctx->get_saved_variables();
        const at::Tensor &values = saved[0], &tau = saved[2], &pooled = saved[6], &stats = saved[7];
        const std::optional<at::Tensor> scores = saved[1].defined() ? std::optional(saved[1]) : std::nullopt;
        const std::optional<at::Tensor> projection = saved[8].defined() ? std::optional(saved[8]) : std::nullopt;
        std::vector<int64_t> geometry = ctx->saved_data["geometry"].toIntVector();
        const bool log_tau = ctx->saved_data["log_tau"].toBool();
        const bool score_map = scores.has_value() && scores->dim() > 1 && !projection.has_value();  // else weights
        // autograd's edges are the tensor arguments given: values, scores (if given), tau, projection (if given)
        const bool need_v = ctx->needs_input_grad(0), need_s = scores.has_value() && ctx->needs_input_grad(1);
        const size_t tau_edge = scores.has_value() ? 2 : 1;
        const bool need_tau = ctx->needs_input_grad(tau_edge);
        const bool need_p = projection.has_value() && ctx->needs_input_grad(tau_edge + 1);
        if (at::GradMode::is_enabled()) {  // create_graph=True: the gradient needs a graph of its own
            static auto vjp = c10::Dispatcher::singleton()
                                  .findSchemaOrThrow("gatepool::softmax_pool_vjp", "")
                                  .typed<std::vector<at::Tensor>(const at::Tensor &, const at::Tensor &,
                                                                 const std::optional<at::Tensor> &,
                                                                 const at::Tensor &, at::IntArrayRef,
                                                                 const std::optional<at::Tensor> &, bool, bool,
                                                                 bool, bool, bool)>();
            auto g = vjp.call(grads[0], values, scores, tau, geometry, projection, log_tau, need_v, need_s,
                              need_tau, need_p);
            return {need_v ? g[0] : at::Tensor(), need_s ? g[1] : at::Tensor(), need_tau ? g[2] : at::Tensor(),
                    at::Tensor(), need_p ? g[3] : at::Tensor(), at::Tensor()};
        }
        const int64_t cs = !scores.has_value() ? values.size(1) : score_map ? scores->size(1) : 1;
        Pool pool{decode(geometry, values, cs, tau.numel()), saved[3], saved[4],
                  score_map || !scores.has_value() ? at::Tensor() : in_type(*scores, saved[5].scalar_type()), saved[5],
                  saved[9]};
        at::Tensor go = last(grads[0]);  // ∂L/∂out in the kernel's layout
        at::Tensor grad_p;
        if (pool.p.defined()) {  // out = V · pooled: ∂L/∂pooled = Vᵀ ∂L/∂out, ∂L/∂V = Σ ∂L/∂out ⊗ pooled
            if (need_p) grad_p = outer(go, pooled, pool.p);
            go = times(go, pool.p, true);
        }
        auto [gv, gs, gt] = pool.backward(pooled, stats, go, score_map, need_tau, log_tau);
        at::Tensor grad_scores = !need_s ? at::Tensor() : score_map ? like(gs, *scores) : gs;
        return {need_v ? like(gv, values) : at::Tensor(), grad_scores, gt, at::Tensor(), grad_p, at::Tensor()};
    }
};

}  // namespace gatepool

namespace {

at::Tensor softmax_pool_autograd(const at::Tensor &values, const std::optional<at::Tensor> &scores,
                                 const at::Tensor &tau, at::IntArrayRef geometry,
                                 const std::optional<at::Tensor> &projection, bool log_tau) {
    return gatepool::SoftmaxPoolEager::apply(values, scores, tau, geometry.vec(), projection, log_tau);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(gatepool, m) {
    m.def("softmax_pool_eager(Tensor values, Tensor? scores, Tensor tau, int[] geometry, Tensor? projection=None, "
          "bool log_tau=False) -> Tensor");
}

TORCH_LIBRARY_IMPL(gatepool, CPU, m) { m.impl("softmax_pool_eager", softmax_pool_cpu); }

TORCH_LIBRARY_IMPL(gatepool, Autograd, m) { m.impl("softmax_pool_eager", softmax_pool_autograd); }
