/* gatepool::softmax_pool_eager: the C kernels of softmax_pool.c as one torch operator whose autograd is in
   C++, for eager calls on the CPU (fused_pool.eager says when; fused_pool.py has the equations).

       softmax_pool_eager(Tensor values, Tensor? scores, Tensor tau, int[] geometry) -> Tensor

   values (N, C, *spatial) in any memory format; scores None (soft pooling, s = v), a score map
   (N, 1, *spatial) or score weights (C); tau (1) or (C) in the compute type (float32 for float16 /
   bfloat16 values, as the kernels' a = 1/τ); geometry as fused_pool.encode writes it. Out (N, C, *out)
   in values' memory format.

   It makes the same kernel calls on the same operands as the Python op gatepool::softmax_pool and its
   autograd formula (fused_pool.py), so the values and gradients are the op's bit for bit. What it saves is
   the interpreter between them: a small input's call is mostly that (issue 44: the per-call cost of a
   (2, 8, 4, 4) pool). One dispatcher call forward; the backward is a node that autograd's engine runs
   without Python. A backward that must itself be differentiable (create_graph=True) calls
   gatepool::softmax_pool_vjp, which fused_pool.py defines: autograd through the plain path. */

#include <ATen/core/Tensor.h>
#include <ATen/Parallel.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/empty.h>
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

/* (N, C, *S) as channels-last memory (N, *S, C), contiguous: a view where it is there already. */
at::Tensor last(const at::Tensor &t) {
    at::Tensor m = t.movedim(1, -1);
    if (channels_last_memory(t)) return m;
    if (t.numel() > SMALL || !t.is_contiguous()) return m.contiguous();
    at::Tensor out = at::empty(m.sizes(), t.options());
    transpose(t, out, true);
    return out;
}

/* Kernel layout (N, *S, C) back to (N, C, *S), in like's memory format. */
at::Tensor like(const at::Tensor &y, const at::Tensor &like) {
    at::Tensor out = y.movedim(-1, 1);
    if (channels_last_memory(like)) return out;
    if (y.numel() > SMALL) return out.contiguous();
    at::Tensor dense = at::empty(out.sizes(), y.options());
    transpose(y, dense, false);
    return dense;
}

/* The per-thread rows (threads, K) summed: (K). */
at::Tensor threads_sum(const at::Tensor &t) { return t.size(0) == 1 ? t.select(0, 0) : t.sum(0); }

/* a = 1/τ (CA) in the compute type t: an IEEE division per entry, as at::reciprocal's. */
at::Tensor inverse(const at::Tensor &tau, at::ScalarType t) {
    const at::Tensor tt = tau.scalar_type() == t && tau.is_contiguous() ? tau : tau.to(t).contiguous();
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
   (values and the score map in channels-last memory, the score weights, a = 1/τ). The forward makes them
   (make); the backward takes the forward's, saved. */
struct Pool {
    gp_geometry g;
    at::Tensor v, s, w, a;  // s: the score map (v itself for soft pooling), or undefined with weights w

    static Pool make(const at::Tensor &values, const std::optional<at::Tensor> &scores, const at::Tensor &tau,
                     at::IntArrayRef geometry) {
        const bool weights = scores.has_value() && scores->dim() == 1;
        const int64_t cs = weights ? 1 : scores.has_value() ? scores->size(1) : values.size(1);
        at::Tensor v = last(values);
        return {decode(geometry, values, cs, tau.numel()), v,
                !scores.has_value() ? v : weights ? at::Tensor() : last(*scores),
                weights ? scores->contiguous() : at::Tensor(),
                inverse(tau, compute_type(values.scalar_type()))};
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

    /* (∂L/∂values, ∂L/∂scores, ∂L/∂τ) in the kernel's layouts; undefined where not asked for. */
    std::tuple<at::Tensor, at::Tensor, at::Tensor> backward(const at::Tensor &out, const at::Tensor &stats,
                                                            const at::Tensor &grad_out, bool score_map,
                                                            bool need_tau) const {
        const int threads = at::get_num_threads();
        at::Tensor go = last(grad_out);
        at::Tensor gv = at::empty_like(v);
        at::Tensor gs = score_map ? at::empty_like(s) : at::Tensor();
        at::Tensor ga = need_tau ? at::zeros({threads, g.ca}, a.options()) : at::Tensor();
        at::Tensor gw = w.defined() ? at::empty({threads, g.c}, a.options()) : at::Tensor();  // rows zeroed there
        gp_tensors ts{v.data_ptr(), s.defined() ? s.data_ptr() : nullptr, a.data_ptr(),
                      w.defined() ? w.data_ptr() : nullptr, out.data_ptr(), stats.data_ptr(), go.data_ptr(),
                      gv.data_ptr(), gs.defined() ? gs.data_ptr() : nullptr,
                      ga.defined() ? ga.data_ptr() : nullptr, gw.defined() ? gw.data_ptr() : nullptr};
        kernels(v.scalar_type()).second(&g, &ts, threads);
        at::Tensor grad_scores = w.defined() ? threads_sum(gw) : gs;  // ∂L/∂w, or ∂L/∂s (N, *S, 1)
        // ∂L/∂τ = −∂L/∂a / τ²: (−Σ ∂L/∂a) a a, the Python op's order
        at::Tensor grad_tau = need_tau ? threads_sum(ga).neg().mul_(a).mul_(a) : at::Tensor();
        return {gv, grad_scores, grad_tau};
    }
};

at::Tensor softmax_pool_cpu(const at::Tensor &values, const std::optional<at::Tensor> &scores,
                            const at::Tensor &tau, at::IntArrayRef geometry) {
    return like(Pool::make(values, scores, tau, geometry).forward().first, values);
}

}  // namespace

namespace gatepool {

/* The autograd node's name: torch::autograd::CppNode<gatepool::SoftmaxPoolEager>. */
struct SoftmaxPoolEager : public torch::autograd::Function<SoftmaxPoolEager> {
    static at::Tensor forward(torch::autograd::AutogradContext *ctx, const at::Tensor &values,
                              const std::optional<at::Tensor> &scores, const at::Tensor &tau,
                              std::vector<int64_t> geometry) {
        Pool pool = Pool::make(values, scores, tau, geometry);
        auto [out, stats] = pool.forward();
        ctx->save_for_backward({values, scores.value_or(at::Tensor()), tau, pool.v, pool.s, pool.a, out, stats});
        ctx->saved_data["geometry"] = std::move(geometry);
        return like(out, values);
    }

    static torch::autograd::variable_list backward(torch::autograd::AutogradContext *ctx,
                                                  torch::autograd::variable_list grads) {
        torch::autograd::variable_list saved = ctx->get_saved_variables();
        const at::Tensor &values = saved[0], &tau = saved[2], &out = saved[6], &stats = saved[7];
        const std::optional<at::Tensor> scores = saved[1].defined() ? std::optional(saved[1]) : std::nullopt;
        std::vector<int64_t> geometry = ctx->saved_data["geometry"].toIntVector();
        const bool score_map = scores.has_value() && scores->dim() > 1;
        // autograd's edges are the tensor arguments given: values, scores (if given), tau
        const bool need_v = ctx->needs_input_grad(0), need_s = scores.has_value() && ctx->needs_input_grad(1);
        const bool need_tau = ctx->needs_input_grad(scores.has_value() ? 2 : 1);
        if (at::GradMode::is_enabled()) {  // create_graph=True: the gradient needs a graph of its own
            static auto vjp = c10::Dispatcher::singleton()
                                  .findSchemaOrThrow("gatepool::softmax_pool_vjp", "")
                                  .typed<std::vector<at::Tensor>(const at::Tensor &, const at::Tensor &,
                                                                 const std::optional<at::Tensor> &,
                                                                 const at::Tensor &, at::IntArrayRef, bool,
                                                                 bool, bool)>();
            auto g = vjp.call(grads[0], values, scores, tau, geometry, need_v, need_s, need_tau);
            return {need_v ? g[0] : at::Tensor(), need_s ? g[1] : at::Tensor(), need_tau ? g[2] : at::Tensor(),
                    at::Tensor()};
        }
        const int64_t cs = !scores.has_value() ? values.size(1) : score_map ? scores->size(1) : 1;
        Pool pool{decode(geometry, values, cs, tau.numel()), saved[3], saved[4],
                  score_map || !scores.has_value() ? at::Tensor() : scores->contiguous(), saved[5]};
        auto [gv, gs, gt] = pool.backward(out, stats, grads[0], score_map, need_tau);
        at::Tensor grad_scores = !need_s ? at::Tensor() : score_map ? like(gs, *scores) : gs;
        return {need_v ? like(gv, values) : at::Tensor(), grad_scores, gt, at::Tensor()};
    }
};

}  // namespace gatepool

namespace {

at::Tensor softmax_pool_autograd(const at::Tensor &values, const std::optional<at::Tensor> &scores,
                                 const at::Tensor &tau, at::IntArrayRef geometry) {
    return gatepool::SoftmaxPoolEager::apply(values, scores, tau, geometry.vec());
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(gatepool, m) {
    m.def("softmax_pool_eager(Tensor values, Tensor? scores, Tensor tau, int[] geometry) -> Tensor");
}

TORCH_LIBRARY_IMPL(gatepool, CPU, m) { m.impl("softmax_pool_eager", softmax_pool_cpu); }

TORCH_LIBRARY_IMPL(gatepool, Autograd, m) { m.impl("softmax_pool_eager", softmax_pool_autograd); }
