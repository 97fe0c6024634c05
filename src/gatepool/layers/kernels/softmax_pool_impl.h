/* The kernels of softmax_pool.c for one type in memory S, computed in T (float or double), included once
   per S. Where S is narrower than T (float16, bfloat16):
   - out is rounded to S, so the backward does not read it: it recomputes each window's out in T from the
     saved m and 1/den (out = Σ_j g_j v_j, the g_j it then uses), as Σ_j g_j (v_j − out) must cancel to
     T's precision, not S's (∂L/∂τ sums it over every window, and would sum S's rounding error); with
     score weights out (and ∂L/∂out) are T, and read as they are;
   - the gradients are summed in T, in a buffer per thread and batch element, and rounded to S once. */

#define CAT_(a, b) a##_##b
#define CAT(a, b) CAT_(a, b)

/* A channel block of LANES as one vector (gcc/clang vector extensions: one register where its width is the
   target's, softmax_pool.c's GP_FLOAT_BYTES); VSELECT/VMAX by masks, as C has no ?: on vectors. */
typedef T CAT(vec, SUFFIX) __attribute__((vector_size(sizeof(T) * LANES)));
typedef ITYPE CAT(ivec, SUFFIX) __attribute__((vector_size(sizeof(ITYPE) * LANES)));
typedef S CAT(svec, SUFFIX) __attribute__((vector_size(sizeof(S) * LANES))); /* a channel block in memory */
#define VEC CAT(vec, SUFFIX)
#define IVEC CAT(ivec, SUFFIX)
#define SVEC CAT(svec, SUFFIX)
#define NARROW (sizeof(S) < sizeof(T)) /* S is computed in a wider T: the recomputed out, the T buffers */

/* The first r lanes (the rest 0) from p, and back; r is LANES but in a block of the last channels.
   vload / vstore: T in memory; vloads / vstores: S, converted (FROM_S), rounded on the way out (TO_S). */
static inline __attribute__((always_inline)) VEC CAT(vload, SUFFIX)(const T *p, const int r) {
    VEC x = {0};
    memcpy(&x, p, sizeof(T) * r);
    return x;
}
static inline __attribute__((always_inline)) void CAT(vstore, SUFFIX)(T *p, VEC x, const int r) {
    memcpy(p, &x, sizeof(T) * r);
}
static inline __attribute__((always_inline)) VEC CAT(vloads, SUFFIX)(const S *p, const int r) {
    SVEC x = {0};
    memcpy(&x, p, sizeof(S) * r);
    return FROM_S(x);
}
static inline __attribute__((always_inline)) void CAT(vstores, SUFFIX)(S *p, VEC x, const int r) {
    SVEC y = TO_S(x);
    memcpy(p, &y, sizeof(S) * r);
}
/* vstore where no read follows: a whole vector at a 64-byte boundary goes past the caches (STREAM; the
   backward's sfence orders it), the rest as vstore. Only where T is S: a narrow S's gradients go to a
   buffer that is read again. */
static inline __attribute__((always_inline)) void CAT(vstream, SUFFIX)(T *p, VEC x, const int r) {
#ifdef __AVX512F__
    if (!NARROW && r == LANES && ((uintptr_t)p & 63) == 0) {
        STREAM(p, x);
        return;
    }
#endif
    CAT(vstore, SUFFIX)(p, x, r);
}
/* x into p's r lanes: written where no two windows share an input (vstream), else added to what is there. */
static inline __attribute__((always_inline)) void CAT(vput, SUFFIX)(T *p, VEC x, const int r, const int disjoint) {
    if (disjoint) CAT(vstream, SUFFIX)(p, x, r);
    else CAT(vstore, SUFFIX)(p, CAT(vload, SUFFIX)(p, r) + x, r);
}
static inline VEC CAT(vselect, SUFFIX)(IVEC mask, VEC a, VEC b) { return (VEC)((mask & (IVEC)a) | (~mask & (IVEC)b)); }
static inline VEC CAT(vmax, SUFFIX)(VEC a, VEC b) { return CAT(vselect, SUFFIX)(a > b, a, b); }

/* The lanes of x folded by halving, in registers: x combined with x with its halves swapped, then its
   quarters swapped within the halves, and so on, leaves the fold in every lane (a loop over the lanes
   would combine them one after another, which the shared-score windows pay at every tap; halves taken
   through memory stall on the store). __builtin_shuffle is gcc's (4.7 on), __builtin_shufflevector clang's. */
#ifdef __clang__
#define GP_PERMUTE(x, ...) __builtin_shufflevector(x, x, __VA_ARGS__)
#else
#define GP_PERMUTE(x, ...) __builtin_shuffle(x, (IVEC){__VA_ARGS__})
#endif
#if LANES == 16
#define GP_FOLD(x, F)                                                                 \
    x = F(x, GP_PERMUTE(x, 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7));  \
    x = F(x, GP_PERMUTE(x, 4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11));  \
    x = F(x, GP_PERMUTE(x, 2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13));  \
    x = F(x, GP_PERMUTE(x, 1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14))
#elif LANES == 8
#define GP_FOLD(x, F)                                  \
    x = F(x, GP_PERMUTE(x, 4, 5, 6, 7, 0, 1, 2, 3));  \
    x = F(x, GP_PERMUTE(x, 2, 3, 0, 1, 6, 7, 4, 5));  \
    x = F(x, GP_PERMUTE(x, 1, 0, 3, 2, 5, 4, 7, 6))
#else
#error "GP_FOLD: LANES must be 16 or 8"
#endif
#define GP_ADD(a, b) ((a) + (b))
#define GP_OR(a, b) ((a) | (b))
static inline __attribute__((always_inline)) T CAT(vsum, SUFFIX)(VEC x) {
    GP_FOLD(x, GP_ADD);
    return x[0];
}
static inline __attribute__((always_inline)) int CAT(vany, SUFFIX)(IVEC mask) {
    GP_FOLD(mask, GP_OR);
    return mask[0] != 0;
}
#undef GP_ADD
#undef GP_OR
#undef GP_FOLD
#undef GP_PERMUTE

/* Σ_c v_c w_c or Σ_c (v_c − y_c) g_c over C channels, in vector blocks and a tree sum: v in memory (S),
   w, y and g in T. Whole blocks have a constant r, so their loads are plain vector loads. */
#define GP_VDOT(BLOCK)                                                          \
    VEC acc = {0};                                                              \
    int64_t c = 0;                                                              \
    for (; c + LANES <= C; c += LANES) acc += BLOCK(LANES);                     \
    if (c < C) acc += BLOCK((int)(C - c));                                      \
    return CAT(vsum, SUFFIX)(acc)
static inline __attribute__((always_inline)) T CAT(vdot_w, SUFFIX)(const S *v, const T *w, int64_t C) {
#define GP_BLOCK(r) CAT(vloads, SUFFIX)(v + c, r) * CAT(vload, SUFFIX)(w + c, r)
    GP_VDOT(GP_BLOCK);
#undef GP_BLOCK
}
static inline __attribute__((always_inline)) T CAT(vdot_push, SUFFIX)(const S *v, const T *y, const T *g,
                                                                    int64_t C) {
#define GP_BLOCK(r) (CAT(vloads, SUFFIX)(v + c, r) - CAT(vload, SUFFIX)(y + c, r)) * CAT(vload, SUFFIX)(g + c, r)
    GP_VDOT(GP_BLOCK);
#undef GP_BLOCK
}
#undef GP_VDOT

/* The shared score of input element j (n · IS + tap): the score map's, or w · v_j where weights are given. */
static inline T CAT(shared_score, SUFFIX)(const gp_tensors *ts, int64_t j, int64_t C) {
    const T *w = ts->w;
    const S *vj = (const S *)ts->v + j * C;
    return w ? CAT(vdot_w, SUFFIX)(vj, w, C) : S_TO_T(((const S *)ts->s)[j]);
}

/* Redo lane c of one window (taps[0..nt)) by the limits; returns out, leaves the gates in gate[]. */
static double CAT(limit_lane, SUFFIX)(const gp_geometry *g, const gp_tensors *ts, int64_t n,
                                       const int64_t *taps, int nt, int64_t c, double *z, double *vals,
                                       double *gate, int *finite_top) {
    const int64_t C = g->c, CS = g->cs, IS = volume(g->in_size);
    const int per_channel = CS == C && !ts->w; /* a score per channel, else one per position */
    const S *v = ts->v, *s = ts->s;
    const T *a = ts->a;
    double ac = a[g->ca == C ? c : 0];
    for (int t = 0; t < nt; t++) {
        int64_t j = n * IS + taps[t];
        z[t] = ac * (double)(per_channel ? S_TO_T(s[j * C + c]) : CAT(shared_score, SUFFIX)(ts, j, C));
        vals[t] = S_TO_T(v[j * C + c]);
    }
    return limit_window(nt, z, vals, gate, finite_top);
}

/* The score-per-channel window over B channel blocks of LANES (B = 1 or 2, a constant: the loops over b
   unroll, each block's m, den and Σ e v stay in registers), the last block's lanes r (≤ LANES): the max,
   then one pass for den and Σ e v. taps: the window's tap offsets in elements, channels included.
   Returns 1 if an output is not finite (its lanes are then redone by the limits). */
static inline __attribute__((always_inline)) int CAT(forward_vec, SUFFIX)(
    const S *s, const S *v, const int64_t *taps, int nt, const T *av, S *y, T *mm, T *rd, const int B,
    const int r) {
    VEC a[2], m[2], den[2], num[2];
    IVEC bad;
#define RB (b == B - 1 ? r : LANES)
    for (int b = 0; b < B; b++) {
        a[b] = CAT(vload, SUFFIX)(av + b * LANES, RB);
        den[b] = num[b] = a[b] - a[b];
        m[b] = den[b] - INFINITY;
    }
    for (int t = 0; t < nt; t++)
        for (int b = 0; b < B; b++)
            m[b] = CAT(vmax, SUFFIX)(m[b], a[b] * CAT(vloads, SUFFIX)(s + taps[t] + b * LANES, RB));
    for (int t = 0; t < nt; t++)
        for (int b = 0; b < B; b++) {
            VEC e = VEXP(a[b] * CAT(vloads, SUFFIX)(s + taps[t] + b * LANES, RB) - m[b]);
            den[b] += e;
            num[b] += e * CAT(vloads, SUFFIX)(v + taps[t] + b * LANES, RB);
        }
    for (int b = 0; b < B; b++) {
        VEC q = 1 / den[b], yv = num[b] * q;
        CAT(vstores, SUFFIX)(y + b * LANES, yv, RB);
        CAT(vstore, SUFFIX)(mm + b * LANES, m[b], RB);
        CAT(vstore, SUFFIX)(rd + b * LANES, q, RB);
        bad = b ? bad | (yv - yv != 0) : yv - yv != 0; /* ±inf or NaN (lanes past r: 0, finite) */
    }
#undef RB
    return CAT(vany, SUFFIX)(bad);
}

/* The backward of one channel block of a score-per-channel window (r lanes, as forward_vec): writes
   (disjoint) or adds the taps' ∂L/∂v (and ∂L/∂s unless has_gs is 0: soft pooling, s = v) and adds the
   lanes' Σ push·s to gac. A lane with m = NaN (redone by the limits) contributes nothing here: returns 1
   if there is one. has_gs, disjoint and r (but in the last block) are constants at each call, so their
   branches vanish. Where S is narrow, out is recomputed as the forward computed it, (Σ_j e_j v_j) · q in T,
   not read from y (rounded to S there); the gates g_j = e_j q are kept in gbuf (nt blocks). */
static inline __attribute__((always_inline)) int CAT(backward_vec, SUFFIX)(
    const S *s, const S *v, const int64_t *taps, int nt, const T *av, const T *ac, const S *y, const T *mm,
    const T *rd, const S *go, T *gv, T *gs, T *gac, VEC *gbuf, const int has_gs, const int disjoint,
    const int r) {
    const VEC a = CAT(vload, SUFFIX)(av, r), a1 = CAT(vload, SUFFIX)(ac, r), zero = a - a;
    const VEC mv = CAT(vload, SUFFIX)(mm, r);
    const IVEC fast = mv == mv;
    const VEC m = CAT(vselect, SUFFIX)(fast, mv, zero);
    const VEC q = CAT(vselect, SUFFIX)(fast, CAT(vload, SUFFIX)(rd, r), zero);
    const VEC g = CAT(vselect, SUFFIX)(fast, CAT(vloads, SUFFIX)(go, r), zero);
    VEC yv = zero, ga = zero;
    /* e_j as the forward's (a · s_j − m rounded as there), and g_j = e_j q; 0 in a lane redone by the
       limits (whose z may be anything) */
#define GP_EXP(sj) VEXP(CAT(vselect, SUFFIX)(fast, a * (sj) - m, zero))
    if (NARROW) {
        for (int t = 0; t < nt; t++) { /* out = (Σ_j e_j v_j) q in T, the forward's sum */
            VEC sj = CAT(vloads, SUFFIX)(s + taps[t], r), e = GP_EXP(sj);
            gbuf[t] = e * q;
            yv += e * (has_gs ? CAT(vloads, SUFFIX)(v + taps[t], r) : sj);
        }
        yv = yv * q;
    } else
        yv = CAT(vselect, SUFFIX)(fast, CAT(vloads, SUFFIX)(y, r), zero);
    for (int t = 0; t < nt; t++) {
        VEC sj = CAT(vloads, SUFFIX)(s + taps[t], r), vj = has_gs ? CAT(vloads, SUFFIX)(v + taps[t], r) : sj;
        VEC gj = NARROW ? gbuf[t] : GP_EXP(sj) * q;
        VEC push = CAT(vselect, SUFFIX)(fast, gj * (vj - yv) * g, zero); /* g_j (v_j − out) G; not 0 · inf */
        VEC dv = has_gs ? gj * g : gj * g + a1 * push;
        T *gvj = gv + taps[t], *gsj = has_gs ? gs + taps[t] : NULL;
        CAT(vput, SUFFIX)(gvj, dv, r, disjoint);
        if (has_gs) CAT(vput, SUFFIX)(gsj, a1 * push, r, disjoint);
        ga += CAT(vselect, SUFFIX)(fast, push * sj, zero);
    }
#undef GP_EXP
    CAT(vstore, SUFFIX)(gac, CAT(vload, SUFFIX)(gac, r) + ga, r);
    return CAT(vany, SUFFIX)(~fast); /* lanes past r: m = 0, fast */
}

/* The shared-score window with score weights w (the attention gate: s_j = w · v_j), over NB channel
   blocks of LANES (NB = 1 … SHARED_BLOCKS, a constant: the loops over blocks unroll, and w, the window's
   sums, out, G and ∂L/∂w stay in registers), the last block's lanes r. Each tap's score is summed by
   shared_dot from the tap's loaded blocks, forward and backward alike, so the backward's z_j − m is the
   forward's to the bit. */
#define RB (b == NB - 1 ? r : LANES)
static inline __attribute__((always_inline)) void CAT(shared_load, SUFFIX)(VEC *vb, const S *vj, const int NB,
                                                                          const int r) {
    for (int b = 0; b < NB; b++) vb[b] = CAT(vloads, SUFFIX)(vj + b * LANES, RB);
}
static inline __attribute__((always_inline)) T CAT(shared_dot, SUFFIX)(const VEC *vb, const VEC *wv, const int NB) {
    VEC acc = {0};
    for (int b = 0; b < NB; b++) acc += wv[b] * vb[b];
    return CAT(vsum, SUFFIX)(acc);
}

/* The forward of one window (the taps' offsets toff, channels included; as = a · SCALE): z_j = as s_j,
   m = max_j z_j, out = Σ_j e^(z_j − m) v_j / Σ_j e^(z_j − m). Returns 1 if out is not finite. */
static inline __attribute__((always_inline)) int CAT(shared_forward_vec, SUFFIX)(
    const S *v, const int64_t *toff, int nt, const T *w, T as, T *zs, T *y, T *mm, T *rd, const int NB,
    const int r) {
    VEC wv[SHARED_BLOCKS], num[SHARED_BLOCKS], vb[SHARED_BLOCKS];
    IVEC bad = {0};
    T m = -INFINITY, d = 0;
    for (int b = 0; b < NB; b++) {
        wv[b] = CAT(vload, SUFFIX)(w + b * LANES, RB);
        num[b] = (VEC){0};
    }
    for (int t = 0; t < nt; t++) {
        CAT(shared_load, SUFFIX)(vb, v + toff[t], NB, r);
        zs[t] = as * CAT(shared_dot, SUFFIX)(vb, wv, NB);
        m = zs[t] > m ? zs[t] : m;
    }
    for (int t = 0; t < nt; t++) {
        T e = EXP(zs[t] - m);
        d += e;
        CAT(shared_load, SUFFIX)(vb, v + toff[t], NB, r);
        for (int b = 0; b < NB; b++) num[b] += e * vb[b];
    }
    T q = 1 / d;
    for (int b = 0; b < NB; b++) {
        VEC yb = num[b] * q;
        CAT(vstore, SUFFIX)(y + b * LANES, yb, RB);
        bad |= yb - yb != 0; /* ±inf or NaN (lanes past r: 0, finite) */
    }
    *mm = m;
    *rd = q;
    return CAT(vany, SUFFIX)(bad);
}

/* The backward of one finite window (m, q = 1/den from the forward; a = 1/τ, as = a · SCALE), G = ∂L/∂out:
       g_j = e^(as s_j − m) q,   push_j = (v_j − out) · G,   ∂L/∂s_j = a g_j push_j
       ∂L/∂v_j += g_j G + ∂L/∂s_j w   (written, not added, where windows are disjoint)
       ∂L/∂w += Σ_j ∂L/∂s_j v_j (into gww),   ∂L/∂a += Σ_j g_j push_j s_j (into *gaw unless NULL)
   out and G are T here (with score weights out is T). */
static inline __attribute__((always_inline)) void CAT(shared_backward_vec, SUFFIX)(
    const S *v, const int64_t *toff, int nt, const T *w, T a, T as, const T *y, T m, T q, const T *go, T *gv,
    T *gww, T *gaw, const int disjoint, const int NB, const int r) {
    VEC wv[SHARED_BLOCKS], yv[SHARED_BLOCKS], gov[SHARED_BLOCKS], gwv[SHARED_BLOCKS], vb[SHARED_BLOCKS];
    T ga = 0;
    for (int b = 0; b < NB; b++) {
        wv[b] = CAT(vload, SUFFIX)(w + b * LANES, RB);
        yv[b] = CAT(vload, SUFFIX)(y + b * LANES, RB);
        gov[b] = CAT(vload, SUFFIX)(go + b * LANES, RB);
        gwv[b] = (VEC){0};
    }
    for (int t = 0; t < nt; t++) {
        T *gvj = gv + toff[t];
        VEC acc = {0};
        CAT(shared_load, SUFFIX)(vb, v + toff[t], NB, r); /* once: the stores to gvj below may alias it */
        for (int b = 0; b < NB; b++) acc += (vb[b] - yv[b]) * gov[b];
        T sj = CAT(shared_dot, SUFFIX)(vb, wv, NB), push = CAT(vsum, SUFFIX)(acc);
        T gj = EXP(as * sj - m) * q, dsj = a * gj * push;
        for (int b = 0; b < NB; b++) {
            VEC dv = gj * gov[b] + dsj * wv[b];
            CAT(vput, SUFFIX)(gvj + b * LANES, dv, RB, disjoint);
            gwv[b] += dsj * vb[b];
        }
        ga += gj * push * sj;
    }
    for (int b = 0; b < NB; b++)
        CAT(vstore, SUFFIX)(gww + b * LANES, CAT(vload, SUFFIX)(gww + b * LANES, RB) + gwv[b], RB);
    if (gaw) *gaw += ga;
}
#undef RB

/* dst[0..count) = src rounded to S, in channel blocks. */
static void CAT(round_into, SUFFIX)(S *dst, const T *src, int64_t count) {
    int64_t i = 0;
    for (; i + LANES <= count; i += LANES) CAT(vstores, SUFFIX)(dst + i, CAT(vload, SUFFIX)(src + i, LANES), LANES);
    if (i < count) CAT(vstores, SUFFIX)(dst + i, CAT(vload, SUFFIX)(src + i, (int)(count - i)), (int)(count - i));
}

/* out: (N, *out, C); stats: (2, N, *out, CS), the window max m and 1 / den per lane (m = NaN: a lane
   redone by the limits). Returns how many outputs are not finite. */
int64_t CAT(softmax_pool_forward, SUFFIX)(const gp_geometry *g, const gp_tensors *ts, int threads) {
    const int64_t N = g->n, C = g->c, CS = g->cs, a_per_channel = g->ca == C;
    const int64_t IS = volume(g->in_size), OS = volume(g->out_size), K = volume(g->kernel);
    const int per_channel = CS == C && !ts->w; /* a score per channel, else one per position (C = 1 too) */
    const S *v = ts->v, *s = ts->s;
    const T *a = ts->a, *w = ts->w;
    S *out = w ? NULL : ts->out;
    T *outw = w ? ts->out : NULL, *stats = ts->stats; /* with score weights out is T (see the top) */
    const int nb = (int)((C + LANES - 1) / LANES), r = (int)(C - (nb - 1) * LANES); /* shared_forward_vec's */
    int64_t bad = 0, *windows = windows_of(g);
#pragma omp parallel num_threads(threads) reduction(+ : bad)
    {
        double *z = malloc(sizeof(double) * 3 * K), *vals = z + K, *gate = z + 2 * K;
        int64_t *toff = malloc(sizeof(int64_t) * K);
        T *av = malloc(sizeof(T) * (2 * C + K)), *zs = av + C, *yt = zs + K; /* a · SCALE (EXP's base); z; out */
        for (int64_t c = 0; c < C; c++) av[c] = a[a_per_channel ? c : 0] * SCALE;
#pragma omp for schedule(static)
        for (int64_t no = 0; no < N * OS; no++) {
            int64_t n = no / OS;
            const int64_t *taps = windows + (no % OS) * (K + 1) + 1;
            int nt = (int)taps[-1], finite_top, slow = 0;
            S *y = out ? out + no * C : NULL;
            T *yw = outw ? outw + no * C : NULL, *mm = stats + no * CS, *rd = stats + (N * OS + no) * CS;
            if (no + PREFETCH_AHEAD < N * OS)
                prefetch_window(v, windows, no + PREFETCH_AHEAD, OS, K, IS, sizeof(S) * C);
            if (per_channel) { /* a score per channel: channel blocks of LANES, then the rest */
                for (int t = 0; t < nt; t++) toff[t] = (n * IS + taps[t]) * C;
                int64_t c0 = 0;
                for (; c0 + 2 * LANES <= C; c0 += 2 * LANES)
                    slow |= CAT(forward_vec, SUFFIX)(s + c0, v + c0, toff, nt, av + c0, y + c0, mm + c0, rd + c0, 2,
                                                     LANES);
                for (; c0 < C; c0 += LANES) /* a block, and the last one's r lanes */
                    slow |= CAT(forward_vec, SUFFIX)(s + c0, v + c0, toff, nt, av + c0, y + c0, mm + c0, rd + c0, 1,
                                                     C - c0 < LANES ? (int)(C - c0) : LANES);
            } else if (w && C <= SHARED_BLOCKS * LANES) { /* score weights: channel blocks in registers */
                for (int t = 0; t < nt; t++) toff[t] = (n * IS + taps[t]) * C;
#define GP_FORWARD(NB, R) \
    slow = CAT(shared_forward_vec, SUFFIX)(v, toff, nt, w, av[0], zs, yw, mm, rd, NB, R)
                GP_BY_BLOCKS(nb, r, GP_FORWARD);
#undef GP_FORWARD
            } else { /* one score per position, shared by the channels (the map's, or w · v_j) */
                T m = -INFINITY, d = 0;
                for (int t = 0; t < nt; t++) {
                    zs[t] = av[0] * CAT(shared_score, SUFFIX)(ts, n * IS + taps[t], C);
                    m = zs[t] > m ? zs[t] : m;
                }
                for (int64_t c = 0; c < C; c++) yt[c] = 0;
                for (int t = 0; t < nt; t++) {
                    const S *vj = v + (n * IS + taps[t]) * C;
                    T e = EXP(zs[t] - m);
                    d += e;
#pragma omp simd
                    for (int64_t c = 0; c < C; c++) yt[c] += e * S_TO_T(vj[c]);
                }
                T q = 1 / d;
                for (int64_t c = 0; c < C; c++) {
                    if (yw) yw[c] = yt[c] * q;
                    else y[c] = T_TO_S(yt[c] * q);
                    slow |= !isfinite(yt[c] * q);
                }
                mm[0] = m;
                rd[0] = q;
            }
            if (!slow) continue;
            for (int64_t c = 0; c < C; c++) { /* non-finite lanes (all of them for shared scores): the limits */
                if (per_channel && isfinite(S_TO_T(y[c]))) continue;
                double yc = CAT(limit_lane, SUFFIX)(g, ts, n, taps, nt, c, z, vals, gate, &finite_top);
                if (yw) yw[c] = (T)yc;
                else y[c] = T_TO_S((T)yc);
                if (per_channel) mm[c] = NAN;
                bad += !isfinite(yc);
            }
            if (!per_channel) mm[0] = NAN;
        }
        free(toff);
        free(z);
        free(av);
    }
    free(windows);
    return bad;
}

/* gv (and gs, unless NULL: soft pooling, where s = v and both gradients go to gv) are filled here;
   ga: (threads × C or threads × 1) partial sums of ∂L/∂a, or NULL when a needs no gradient; with score
   weights w, gw (threads × C) gets the partial sums of ∂L/∂w and gs is NULL.
   Where no two windows share an input (tiling windows), each gradient is written once, not zeroed
   and then added to (a third of the memory traffic); inputs no window reads are zeroed. Where S is
   narrow, one batch element's gradients are summed in T (buffers per thread, gvn and gsn) and rounded
   to S once, after its last window. */
void CAT(softmax_pool_backward, SUFFIX)(const gp_geometry *g, const gp_tensors *ts, int threads) {
    const int64_t N = g->n, C = g->c, CS = g->cs, a_per_channel = g->ca == C, AC = g->ca;
    const int64_t IS = volume(g->in_size), OS = volume(g->out_size), K = volume(g->kernel);
    const int per_channel = CS == C && !ts->w; /* a score per channel, else one per position (C = 1 too) */
    const S *v = ts->v, *s = ts->s;
    const T *a = ts->a, *stats = ts->stats, *w = ts->w;
    /* out and G: S, or T with score weights (see the top); out is read where S is T only */
    const S *out = w ? NULL : ts->out, *gout = w ? NULL : ts->gout;
    const T *outw = w ? ts->out : NULL, *goutw = w ? ts->gout : NULL;
    S *gv = ts->gv, *gs = ts->gs;
    T *ga = ts->ga, *gw = ts->gw;
    const int nb = (int)((C + LANES - 1) / LANES), r = (int)(C - (nb - 1) * LANES); /* shared_backward_vec's */
    char *covered = disjoint_windows(g) ? coverage(g) : NULL; /* NULL: windows overlap, accumulate */
    const int disjoint = covered != NULL;
    int64_t *windows = windows_of(g);
#pragma omp parallel num_threads(threads)
    {
        double *z = malloc(sizeof(double) * 4 * K), *vals = z + K, *gate = z + 2 * K, *ds = z + 3 * K;
        T *gaw = ga ? ga + (int64_t)THREAD_ID * AC : NULL, *gww = w ? gw + (int64_t)THREAD_ID * C : NULL;
        int64_t *toff = malloc(sizeof(int64_t) * K);
        /* a · SCALE, a; ∂L/∂a (CS = C); out and G in T (the shared windows without channel blocks) */
        T *av = malloc(sizeof(T) * 5 * C), *ac = av + C, *gac = av + 2 * C, *yt = av + 3 * C, *gt = av + 4 * C;
        /* NARROW: the gates of a block's taps (backward_vec), one batch element's gradients in T */
        VEC *gbuf = NARROW ? aligned_alloc(64, sizeof(VEC) * K) : NULL;
        T *gvbuf = NARROW ? malloc(sizeof(T) * IS * C) : NULL, *gsbuf = NARROW && gs ? malloc(sizeof(T) * IS * CS) : NULL;
        for (int64_t c = 0; c < C; c++) { ac[c] = a[a_per_channel ? c : 0]; av[c] = ac[c] * SCALE; gac[c] = 0; }
        if (gaw)
            for (int64_t c = 0; c < AC; c++) gaw[c] = 0;
        if (gww)
            for (int64_t c = 0; c < C; c++) gww[c] = 0;
#pragma omp for schedule(static)
        for (int64_t n = 0; n < N; n++) {
            /* batch element n: its inputs, and where its gradients are summed (T: the tensors themselves) */
            const S *vn = v + n * IS * C, *sn = s ? s + n * IS * CS : NULL;
            T *gvn = NARROW ? gvbuf : (T *)(void *)(gv + n * IS * C);
            T *gsn = !gs ? NULL : NARROW ? gsbuf : (T *)(void *)(gs + n * IS * CS);
            if (!covered) { /* overlapping windows: add up from 0 */
                memset(gvn, 0, sizeof(T) * IS * C);
                if (gsn) memset(gsn, 0, sizeof(T) * IS * CS);
            }
            for (int64_t i = 0; covered && i < IS; i++) { /* tiling: only the inputs no window reads */
                if (covered[i]) continue;
                memset(gvn + i * C, 0, sizeof(T) * C);
                if (gsn) memset(gsn + i * CS, 0, sizeof(T) * CS);
            }
            for (int64_t o = 0; o < OS; o++) {
                const int64_t *taps = windows + o * (K + 1) + 1;
                int nt = (int)taps[-1], finite_top, slow = 0;
                const int64_t at = (n * OS + o) * C;
                const S *y = out ? out + at : NULL, *go = gout ? gout + at : NULL;
                const T *yw = outw ? outw + at : NULL, *gow = goutw ? goutw + at : NULL;
                const T *mm = stats + (n * OS + o) * CS, *rd = stats + (N * OS + n * OS + o) * CS;
                if (n * OS + o + PREFETCH_AHEAD < N * OS)
                    prefetch_window(v, windows, n * OS + o + PREFETCH_AHEAD, OS, K, IS, sizeof(S) * C);
                for (int t = 0; t < nt; t++) toff[t] = taps[t] * C;
                if (!per_channel) slow = isnan(mm[0]); /* CS = C: the blocks below say */
                if (per_channel) {
                    /* four specializations without branches inside, each vectorized */
#define GP_BLOCKS(HAS_GS, DISJOINT)                                                                          \
    do {                                                                                                     \
        int64_t c0 = 0;                                                                                      \
        for (; c0 + LANES <= C; c0 += LANES)                                                                 \
            slow |= CAT(backward_vec, SUFFIX)(sn + c0, vn + c0, toff, nt, av + c0, ac + c0, y + c0, mm + c0,  \
                                              rd + c0, go + c0, gvn + c0, HAS_GS ? gsn + c0 : NULL, gac + c0, \
                                              gbuf, HAS_GS, DISJOINT, LANES);                                \
        if (c0 < C)                                                                                          \
            slow |= CAT(backward_vec, SUFFIX)(sn + c0, vn + c0, toff, nt, av + c0, ac + c0, y + c0, mm + c0,  \
                                              rd + c0, go + c0, gvn + c0, HAS_GS ? gsn + c0 : NULL, gac + c0, \
                                              gbuf, HAS_GS, DISJOINT, (int)(C - c0));                        \
    } while (0)
                    if (gs && disjoint) GP_BLOCKS(1, 1);
                    else if (gs) GP_BLOCKS(1, 0);
                    else if (disjoint) GP_BLOCKS(0, 1);
                    else GP_BLOCKS(0, 0);
#undef GP_BLOCKS
                } else if (!slow && w && C <= SHARED_BLOCKS * LANES) { /* score weights: channel blocks */
#define GP_BACKWARD(DISJOINT, NB, R)                                                                        \
    CAT(shared_backward_vec, SUFFIX)(vn, toff, nt, w, a[0], av[0], yw, mm[0], rd[0], gow, gvn, gww, gaw,   \
                                     DISJOINT, NB, R)
#define GP_DISJOINT(NB, R) GP_BACKWARD(1, NB, R)
#define GP_OVERLAPPING(NB, R) GP_BACKWARD(0, NB, R)
                    if (disjoint) GP_BY_BLOCKS(nb, r, GP_DISJOINT);
                    else GP_BY_BLOCKS(nb, r, GP_OVERLAPPING);
#undef GP_OVERLAPPING
#undef GP_DISJOINT
#undef GP_BACKWARD
                } else if (!slow) {
                    for (int64_t c = 0; c < C; c++) {
                        gt[c] = w ? gow[c] : S_TO_T(go[c]);
                        yt[c] = w ? yw[c] : NARROW ? 0 : S_TO_T(y[c]);
                    }
                    for (int t = 0; NARROW && !w && t < nt; t++) { /* out = (Σ_j e_j v_j) q in T, as the forward */
                        const S *vj = vn + toff[t];
                        T e = EXP(av[0] * CAT(shared_score, SUFFIX)(ts, n * IS + taps[t], C) - mm[0]);
#pragma omp simd
                        for (int64_t c = 0; c < C; c++) yt[c] += e * S_TO_T(vj[c]);
                    }
                    for (int64_t c = 0; NARROW && !w && c < C; c++) yt[c] *= rd[0];
                    for (int t = 0; t < nt; t++) {
                        int64_t j = n * IS + taps[t];
                        const S *vj = vn + toff[t];
                        const T sj = CAT(shared_score, SUFFIX)(ts, j, C);
                        /* push = Σ_c (v_jc − out_c) G_c in LANES blocks: the same sum in every element type */
                        T *gvj = gvn + toff[t], gj = EXP(av[0] * sj - mm[0]) * rd[0];
                        T push = CAT(vdot_push, SUFFIX)(vj, yt, gt, C);
                        if (!w) {
#pragma omp simd
                            for (int64_t c = 0; c < C; c++) gvj[c] = (disjoint ? 0 : gvj[c]) + gj * gt[c];
                            gsn[taps[t]] = (disjoint ? 0 : gsn[taps[t]]) + a[0] * gj * push;
                        } else { /* ∂L/∂s_j = a g_j push, through s_j = w · v_j */
                            T dsj = a[0] * gj * push;
#pragma omp simd
                            for (int64_t c = 0; c < C; c++) {
                                gvj[c] = (disjoint ? 0 : gvj[c]) + gj * gt[c] + dsj * w[c];
                                gww[c] += dsj * S_TO_T(vj[c]);
                            }
                        }
                        if (gaw) gaw[0] += gj * push * sj;
                    }
                }
                if (!slow) continue;
                if (disjoint && !per_channel) /* the shared-score window skipped above: its taps unwritten */
                    for (int t = 0; t < nt; t++) {
                        memset(gvn + toff[t], 0, sizeof(T) * C);
                        if (gsn) gsn[taps[t]] = 0;
                    }
                for (int t = 0; w && t < nt; t++) ds[t] = 0; /* ∂L/∂s_j summed over the lanes, for w */
                for (int64_t c = 0; c < C; c++) { /* the lanes the forward redid: the same limits */
                    if (per_channel && mm[c] == mm[c]) continue;
                    double yc = CAT(limit_lane, SUFFIX)(g, ts, n, taps, nt, c, z, vals, gate, &finite_top);
                    double ac = a[a_per_channel ? c : 0], goc = w ? gow[c] : S_TO_T(go[c]);
                    for (int t = 0; t < nt; t++) {
                        if (gate[t] == 0) continue; /* gate 0: no gradient (not 0 · inf) */
                        gvn[toff[t] + c] += (T)(gate[t] * goc);
                        if (!finite_top) continue; /* a hardmax over ±inf: no score or τ gradient */
                        double push = gate[t] * (vals[t] - yc) * goc;
                        if (gaw) gaw[a_per_channel ? c : 0] += (T)(push * z[t] / ac);
                        if (w) { /* spread over v_j and w once the lanes are summed, below */
                            ds[t] += ac * push;
                            continue;
                        }
                        T *gsj = gsn ? (per_channel ? gsn + toff[t] + c : gsn + taps[t]) : gvn + toff[t] + c;
                        *gsj += (T)(ac * push);
                    }
                }
                for (int t = 0; w && t < nt; t++) { /* through s_j = w · v_j */
                    const S *vj = vn + toff[t];
                    T *gvj = gvn + toff[t];
                    for (int64_t c = 0; c < C; c++) {
                        gvj[c] += (T)(ds[t] * w[c]);
                        gww[c] += (T)(ds[t] * S_TO_T(vj[c]));
                    }
                }
            }
            if (NARROW) { /* batch element n's gradients, rounded to S once */
                CAT(round_into, SUFFIX)(gv + n * IS * C, gvn, IS * C);
                if (gs) CAT(round_into, SUFFIX)(gs + n * IS * CS, gsn, IS * CS);
            }
        }
        if (gaw && per_channel)
            for (int64_t c = 0; c < C; c++) gaw[a_per_channel ? c : 0] += gac[c];
#ifdef __AVX512F__
        _mm_sfence(); /* vstream's stores, before the threads join */
#endif
        free(toff);
        free(z);
        free(av);
        free(gbuf);
        free(gvbuf);
        free(gsbuf);
    }
    free(windows);
    free(covered);
}

#undef VEC
#undef IVEC
#undef SVEC
#undef NARROW
#undef CAT
#undef CAT_
#undef S
#undef SUFFIX
#undef FROM_S
#undef TO_S
#undef S_TO_T
#undef T_TO_S
