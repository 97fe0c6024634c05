/* Window softmax pooling on the CPU, forward and backward, fused: one pass over each window's taps.

   Memory is channels-last: x[n][d][h][w][c] (1-D and 2-D inputs have leading spatial sizes of 1), so
   the channels of a tap are contiguous: with a score per channel, each window is worked through in
   channel blocks of one vector (gcc's vector extensions: 16 floats with AVX-512, 8 without; 8 doubles),
   each block's running max, sum and weighted sum in registers across the window's taps (forward_vec and
   backward_vec in the _impl.h; the last block masked to the channels left); with one score per
   position given by weights (the attention gate), a window's blocks (up to four) stay in registers and
   each tap's score w · v_j is summed across the lanes by halving (shared_forward_vec and
   shared_backward_vec). Every output position's taps are listed once per call (windows_of), not
   recomputed per batch element. Per output position o and channel c, over the window's taps j inside
   the input (padded taps are skipped: gate 0), with a = 1/τ (one per channel, or one):

       z_j = a · s_j                    scores: s = x itself (soft pooling), or a separate score map
       m   = max_j z_j,   den = Σ_j e^(z_j − m),   g_j = e^(z_j − m) / den,   out = Σ_j g_j v_j
       (m and 1/den are saved: the backward recomputes g_j from them)

   In float the exponentials are base 2 (exp2_f: plain arithmetic, no libm call, so it vectorizes):
   z is taken as a · log2(e) · s (SCALE), so the saved m is in those units; double uses libm's exp.

   backward, with G = ∂L/∂out:
       ∂L/∂v_j += g_j G
       ∂L/∂s_j += a g_j (v_j − out) G      (soft pooling, s = v: ∂L/∂x_j = g_j G (1 + a (x_j − out)))
       ∂L/∂a   += Σ_j g_j (v_j − out) s_j G                   (summed over batch and positions)

   One score per position shared by the channels (the attention gate, cs = 1) sums ∂L/∂s_j over c. Its
   score can be given as weights w (C) instead of a map: s_j = w · v_j is then computed here, at each
   tap, forward and backward (no score map is written or read), and the chain rule runs here too:

       ∂L/∂v_j += ∂L/∂s_j · w,      ∂L/∂w += Σ_j ∂L/∂s_j · v_j      (per thread, summed by the caller)

   Non-finite windows take max pooling's limits, as the plain path does (windows.window_softmax): a
   NaN makes the window NaN; a top score of ±inf shares the gate among the taps at the top (no score
   or τ gradient there); a −inf tap beside finite ones gets gate 0; a window with no input tap gives
   −inf. The vectorized loop assumes finite windows; a lane whose result comes out non-finite is redone
   by a scalar routine (limit_window) and marked with m = NaN, so the backward redoes it too.

   Types: float and double, and float16 / bfloat16 in memory, computed in float (loaded into float
   vectors, rounded to nearest even when stored; m and 1/den, a, w and the partial sums of ∂L/∂a and
   ∂L/∂w in float). Those two do not read out in the backward: it is recomputed in float per window
   (Σ_j g_j (v_j − out) must cancel to float's precision; see the _impl.h's top), and their gradients are
   summed in float and rounded once. With score weights (the attention gate) out and ∂L/∂out are in the
   computed type: the gate projects out next, and a rounded out would be rounded twice on the way.

   Threads: OpenMP, over (batch, output position) in the forward and over batch elements in the
   backward (each owns its slice of the gradients: no races where windows overlap).

   Memory: each window asks the caches for the inputs of the window PREFETCH_AHEAD positions on
   (prefetch_window): the loop's work per window leaves too few loads in flight for the hardware's
   prefetchers to keep up. Where windows tile, the backward writes ∂L/∂v with streaming stores on
   AVX-512 (vstream): written once and not read here, so the lines need not be read in first. */

#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__AVX512F__) || defined(__F16C__)
#include <immintrin.h>
#endif
#ifdef _OPENMP
#include <omp.h>
#define THREAD_ID omp_get_thread_num()
#else
#define THREAD_ID 0
#endif

#include "softmax_pool.h"

/* Every field of both structs as "struct.field offset size" lines after "struct size" ones, into buf
   (cap bytes); returns the length the whole text needs. The loader compares it with its ctypes copies. */
int64_t gp_layout(char *buf, int64_t cap) {
    int64_t len = 0;
#define GP_PUT(...) len += snprintf(buf + (len < cap ? len : cap), len < cap ? cap - len : 0, __VA_ARGS__)
#define GP_STRUCT(S) GP_PUT(#S " %zu\n", sizeof(S))
#define GP_FIELD(S, f) GP_PUT(#S "." #f " %zu %zu\n", offsetof(S, f), sizeof(((S *)0)->f))
    GP_STRUCT(gp_geometry);
    GP_FIELD(gp_geometry, n); GP_FIELD(gp_geometry, c); GP_FIELD(gp_geometry, cs); GP_FIELD(gp_geometry, ca);
    GP_FIELD(gp_geometry, in_size); GP_FIELD(gp_geometry, out_size); GP_FIELD(gp_geometry, kernel);
    GP_FIELD(gp_geometry, stride); GP_FIELD(gp_geometry, padding); GP_FIELD(gp_geometry, dilation);
    GP_STRUCT(gp_tensors);
    GP_FIELD(gp_tensors, v); GP_FIELD(gp_tensors, s); GP_FIELD(gp_tensors, a); GP_FIELD(gp_tensors, w);
    GP_FIELD(gp_tensors, out); GP_FIELD(gp_tensors, stats); GP_FIELD(gp_tensors, gout);
    GP_FIELD(gp_tensors, gv); GP_FIELD(gp_tensors, gs); GP_FIELD(gp_tensors, ga); GP_FIELD(gp_tensors, gw);
#undef GP_FIELD
#undef GP_STRUCT
#undef GP_PUT
    return len;
}

/* 2^x for x ≤ 0 in float: x = i + f (|f| ≤ 1/2), Cephes' degree-6 polynomial for e^(f ln 2) (about 1 ulp),
   2^i put into the exponent bits. Plain arithmetic, so a loop over channels vectorizes. The kernels take
   their exponentials in base 2 (SCALE = log2 e folded into a = 1/τ: z = a log2(e) s), so m is in those
   units too. */
static inline float exp2_f(float x) {
    x = x < -126.0f ? -126.0f : x;
    float fi = floorf(x + 0.5f);
    float r = (x - fi) * 0.693147180559945309f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    int32_t bits = ((int32_t)fi + 127) << 23; /* 2^fi as a float's exponent bits */
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return p * scale;
}

/* The float family's vectors (float32, and float16 / bfloat16 computed in it): one register, 64 bytes where
   the target has AVX-512, 32 elsewhere (gcc splits a 64-byte vector into two AVX2 ones, with half the
   registers to hold them: soft pooling 2–5× slower on an AVX2 CPU, docs/benchmarks.md). float64 keeps
   64 bytes (8 lanes) everywhere. */
#if defined(__AVX512F__)
#define GP_FLOAT_BYTES 64
#else
#define GP_FLOAT_BYTES 32
#endif
#define GP_FLOAT_LANES (GP_FLOAT_BYTES / 4)
typedef float vexp_f32 __attribute__((vector_size(GP_FLOAT_BYTES)));
typedef int32_t vexp_i32 __attribute__((vector_size(GP_FLOAT_BYTES)));

/* exp2_f on a vector of floats: the same steps, the rounding by adding 1.5 · 2^23 (round to nearest). */
static inline vexp_f32 exp2_vf(vexp_f32 x) {
    const vexp_f32 floor_ = (vexp_f32){0} - 126.0f; /* not x − x − 126: NaN at x = −inf */
    vexp_i32 low = x < floor_;
    x = (vexp_f32)((low & (vexp_i32)floor_) | (~low & (vexp_i32)x));
    vexp_f32 t = x + 12582912.0f, fi = t - 12582912.0f; /* t's low mantissa bits: round(x) */
    vexp_f32 r = (x - fi) * 0.693147180559945309f;
    vexp_f32 p = r * 1.9875691500e-4f + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    vexp_i32 bits = ((vexp_i32)t - 0x4B400000 + 127) << 23; /* 2^round(x) */
    return p * (vexp_f32)bits;
}

/* Half precision in memory: 16-bit numbers, held as their bits (uint16_t), converted to float on the way
   in and rounded to nearest even on the way out; NaN stays NaN, ±inf stays ±inf, and a float past the
   type's range rounds to ±inf, as torch's conversions do.

   bfloat16 is a float's upper 16 bits: the conversions are shifts and an add (vectorized as they are). */
typedef uint16_t vhalf __attribute__((vector_size(GP_FLOAT_BYTES / 2))); /* a channel block of halves */
typedef uint32_t vexp_u32 __attribute__((vector_size(GP_FLOAT_BYTES)));

static inline float bf16_to_f(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}
static inline uint16_t f_to_bf16(float f) {
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    if (f != f) return (uint16_t)((bits >> 16) | 0x40);              /* NaN: kept, quiet */
    return (uint16_t)((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16);   /* to nearest, ties to even */
}
static inline vexp_f32 bf16_to_vf(vhalf h) { return (vexp_f32)(__builtin_convertvector(h, vexp_u32) << 16); }
static inline vhalf vf_to_bf16(vexp_f32 x) {
    vexp_u32 bits = (vexp_u32)x, nan = (vexp_u32)(x != x);
    vexp_u32 even = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16;
    return __builtin_convertvector((nan & ((bits >> 16) | 0x40)) | (~nan & even), vhalf);
}

/* float16: the CPU's conversions where it has them (F16C, AVX-512), else these, bit by bit. */
static inline float f16_to_f_bits(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 0x1F, m = h & 0x3FF, bits;
    if (e == 0) { /* zero or subnormal: m · 2^−24 */
        float f = (float)m * 0x1p-24f;
        return sign ? -f : f;
    }
    bits = sign | (e == 0x1F ? 0x7F800000 | (m << 13) : ((e + 112) << 23) | (m << 13)); /* ±inf, NaN; 15 → 127 */
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}
static inline uint16_t f_to_f16_bits(float f) {
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    uint16_t sign = (uint16_t)((bits >> 16) & 0x8000);
    uint32_t a = bits & 0x7FFFFFFF;
    if (a > 0x7F800000) return sign | 0x7E00 | (uint16_t)((a >> 13) & 0x3FF); /* NaN: kept, quiet */
    if (a >= 0x477FF000) return sign | 0x7C00; /* ≥ 65520: ±inf (65504's mantissa is odd: the tie goes up) */
    if (a >= 0x38800000) /* ≥ 2^−14: a normal half; 127 → 15, to nearest, ties to even */
        return sign | (uint16_t)((a - 0x38000000 + 0xFFF + ((a >> 13) & 1)) >> 13);
    return sign | (uint16_t)lrintf(fabsf(f) * 0x1p24f); /* subnormal: m · 2^−24, to nearest even */
}
#if defined(__F16C__)
static inline float f16_to_f(uint16_t h) { return _cvtsh_ss(h); }
static inline uint16_t f_to_f16(float f) { return _cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT); }
#else
static inline float f16_to_f(uint16_t h) { return f16_to_f_bits(h); }
static inline uint16_t f_to_f16(float f) { return f_to_f16_bits(f); }
#endif
#if defined(__AVX512F__)
static inline vexp_f32 f16_to_vf(vhalf h) { return (vexp_f32)_mm512_cvtph_ps((__m256i)h); }
static inline vhalf vf_to_f16(vexp_f32 x) {
    return (vhalf)_mm512_cvtps_ph((__m512)x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}
#elif defined(__F16C__) /* 32-byte blocks (GP_FLOAT_BYTES): 8 halves, one conversion each way */
static inline vexp_f32 f16_to_vf(vhalf h) { return (vexp_f32)_mm256_cvtph_ps((__m128i)h); }
static inline vhalf vf_to_f16(vexp_f32 x) { return (vhalf)_mm256_cvtps_ph((__m256)x, _MM_FROUND_TO_NEAREST_INT); }
#else
static inline vexp_f32 f16_to_vf(vhalf h) {
    vexp_f32 x;
    for (int l = 0; l < GP_FLOAT_LANES; l++) x[l] = f16_to_f_bits(h[l]);
    return x;
}
static inline vhalf vf_to_f16(vexp_f32 x) {
    vhalf h;
    for (int l = 0; l < GP_FLOAT_LANES; l++) h[l] = f_to_f16_bits(x[l]);
    return h;
}
#endif

static inline double exp_d(double x) { return exp(x); }

typedef double vexp_f64 __attribute__((vector_size(64)));
static inline vexp_f64 exp_vd(vexp_f64 x) { /* lane by lane: libm's exp */
    for (int l = 0; l < 8; l++) x[l] = exp(x[l]);
    return x;
}

static inline int64_t volume(const int64_t *size) { return size[0] * size[1] * size[2]; }

/* The input positions (flat (d·H + h)·W + w) of output position o's taps inside the input; their count. */
static int taps_of(const gp_geometry *g, int64_t o, int64_t *taps) {
    const int64_t *in = g->in_size, *out = g->out_size, *k = g->kernel, *s = g->stride, *p = g->padding;
    const int64_t *dl = g->dilation;
    int64_t ow = o % out[2], oh = (o / out[2]) % out[1], od = o / (out[2] * out[1]);
    int count = 0;
    for (int64_t a = 0; a < k[0]; a++) {
        int64_t id = od * s[0] - p[0] + a * dl[0];
        if (id < 0 || id >= in[0]) continue;
        for (int64_t b = 0; b < k[1]; b++) {
            int64_t ih = oh * s[1] - p[1] + b * dl[1];
            if (ih < 0 || ih >= in[1]) continue;
            for (int64_t e = 0; e < k[2]; e++) {
                int64_t iw = ow * s[2] - p[2] + e * dl[2];
                if (iw >= 0 && iw < in[2]) taps[count++] = (id * in[1] + ih) * in[2] + iw;
            }
        }
    }
    return count;
}

/* Every output position's taps, computed once per call: row o of the table (K + 1 int64) holds the count,
   then the taps (taps_of). The caller frees it. */
static int64_t *windows_of(const gp_geometry *g) {
    const int64_t OS = volume(g->out_size), K = volume(g->kernel);
    int64_t *table = malloc(sizeof(int64_t) * OS * (K + 1));
    for (int64_t o = 0; o < OS; o++) table[o * (K + 1)] = taps_of(g, o, table + o * (K + 1) + 1);
    return table;
}

/* Output position no's inputs (the taps' rows of `bytes`) asked of the caches ahead of their use; no runs
   over (batch, position), the rows of the windows_of table. always_inline: gcc takes a separate function
   whose only effect is __builtin_prefetch for one without effects, and drops the calls. */
#define PREFETCH_AHEAD 8
static inline __attribute__((always_inline)) void prefetch_window(const void *v, const int64_t *windows,
                                                                  int64_t no, int64_t OS, int64_t K, int64_t IS,
                                                                  int64_t bytes) {
    const int64_t n = no / OS, *taps = windows + (no % OS) * (K + 1) + 1;
    for (int t = 0; t < (int)taps[-1]; t++) {
        const char *row = (const char *)v + (n * IS + taps[t]) * bytes;
        for (int64_t b = 0; b < bytes; b += 64) __builtin_prefetch(row + b);
    }
}

/* Do no two windows read the same input? (stride ≥ span in every dimension: tiling windows) */
static int disjoint_windows(const gp_geometry *g) {
    for (int i = 0; i < 3; i++)
        if (g->stride[i] < g->dilation[i] * (g->kernel[i] - 1) + 1) return 0;
    return 1;
}

/* 1 at the input positions (of one batch element) some window reads, else 0; the caller frees it. */
static char *coverage(const gp_geometry *g) {
    const int64_t IS = volume(g->in_size), OS = volume(g->out_size), K = volume(g->kernel);
    char *covered = calloc(IS, 1);
    int64_t *taps = malloc(sizeof(int64_t) * K);
    for (int64_t o = 0; o < OS; o++) {
        int nt = taps_of(g, o, taps);
        for (int t = 0; t < nt; t++) covered[taps[t]] = 1;
    }
    free(taps);
    return covered;
}

/* One lane's window by the limits, in double: out, and the gates; *finite_top says whether m is finite. */
static double limit_window(int nt, const double *z, const double *v, double *gate, int *finite_top) {
    double m = -INFINITY, den = 0, out = 0;
    int nan = 0, top = 0;
    *finite_top = 0;
    if (nt == 0) return -INFINITY;
    for (int t = 0; t < nt; t++) {
        if (isnan(z[t])) nan = 1;
        else if (z[t] > m) m = z[t];
    }
    if (nan) {
        for (int t = 0; t < nt; t++) gate[t] = NAN;
        return NAN;
    }
    if (isinf(m)) {
        for (int t = 0; t < nt; t++) top += z[t] == m;
        for (int t = 0; t < nt; t++) gate[t] = z[t] == m ? 1.0 / top : 0.0;
    } else {
        *finite_top = 1;
        for (int t = 0; t < nt; t++) den += gate[t] = exp(z[t] - m);
        for (int t = 0; t < nt; t++) gate[t] /= den;
    }
    for (int t = 0; t < nt; t++)
        if (gate[t] != 0) out += gate[t] * v[t];  /* a gate of 0 adds nothing, not 0 · inf */
    return out;
}

/* The shared-score windows with score weights (shared_forward_vec, shared_backward_vec) take up to
   SHARED_BLOCKS channel blocks (64 or 32 floats, 32 doubles); more channels take the loops over c. */
#define SHARED_BLOCKS 4

/* CALL(NB, r) with the block count nb (1 … SHARED_BLOCKS) and the last block's lanes r as constants
   where r = LANES (whole blocks: plain vector loads), else r at run time. */
#define GP_BY_BLOCKS(nb, r, CALL)                                                                         \
    do {                                                                                                  \
        if ((r) == LANES) {                                                                               \
            if ((nb) == 1) CALL(1, LANES); else if ((nb) == 2) CALL(2, LANES);                            \
            else if ((nb) == 3) CALL(3, LANES); else CALL(4, LANES);                                      \
        } else {                                                                                          \
            if ((nb) == 1) CALL(1, r); else if ((nb) == 2) CALL(2, r);                                    \
            else if ((nb) == 3) CALL(3, r); else CALL(4, r);                                              \
        }                                                                                                 \
    } while (0)
_Static_assert(SHARED_BLOCKS == 4, "GP_BY_BLOCKS spells out the block counts 1 to 4");

/* Per element type: T, the type computed in (float or double), EXP(z) of z = SCALE · a · s, LANES, the lanes
   of a vector of T (a channel block: GP_FLOAT_BYTES for float, 64 bytes for double), and STREAM, AVX-512's
   streaming store of one (vstream); per type in memory (the input, the output and their gradients; a, w,
   stats and the partial sums of ∂L/∂a and ∂L/∂w are T): S, its SUFFIX in the exported names, FROM_S / TO_S
   between a channel block of S and one of T, S_TO_T / T_TO_S for one number. The _impl.h #undefs the per-S macros after it.

   float16 and bfloat16 are computed in float: a block of halves (vhalf, their bits) becomes as many floats
   on the way in, and is rounded to nearest even on the way out. */
#define T float
#define EXP exp2_f
#define VEXP exp2_vf
#define ITYPE int32_t
#define SCALE 1.44269504088896341f
#define LANES GP_FLOAT_LANES
#define STREAM(p, x) _mm512_stream_ps(p, (__m512)(x))

#define S float
#define SUFFIX f32
#define FROM_S(x) (x)
#define TO_S(x) (x)
#define S_TO_T(x) (x)
#define T_TO_S(x) (x)
#include "softmax_pool_impl.h"

#define S uint16_t
#define SUFFIX bf16
#define FROM_S(x) bf16_to_vf(x)
#define TO_S(x) vf_to_bf16(x)
#define S_TO_T(x) bf16_to_f(x)
#define T_TO_S(x) f_to_bf16(x)
#include "softmax_pool_impl.h"

#define S uint16_t
#define SUFFIX f16
#define FROM_S(x) f16_to_vf(x)
#define TO_S(x) vf_to_f16(x)
#define S_TO_T(x) f16_to_f(x)
#define T_TO_S(x) f_to_f16(x)
#include "softmax_pool_impl.h"

#undef T
#undef EXP
#undef VEXP
#undef ITYPE
#undef SCALE
#undef LANES
#undef STREAM

#define T double
#define EXP exp_d
#define VEXP exp_vd
#define ITYPE int64_t
#define SCALE 1.0
#define LANES 8
#define STREAM(p, x) _mm512_stream_pd(p, (__m512d)(x))

#define S double
#define SUFFIX f64
#define FROM_S(x) (x)
#define TO_S(x) (x)
#define S_TO_T(x) (x)
#define T_TO_S(x) (x)
#include "softmax_pool_impl.h"
