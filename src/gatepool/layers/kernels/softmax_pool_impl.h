/* The kernels of softmax_pool.c for one element type T (float or double), included once per type. */

#define CAT_(a, b) a##_##b
#define CAT(a, b) CAT_(a, b)

/* Redo lane c of one window (taps[0..nt)) by the limits; returns out, leaves the gates in gate[]. */
static double CAT(limit_lane, SUFFIX)(const gp_geometry *g, const gp_tensors *ts, int64_t n,
                                       const int64_t *taps, int nt, int64_t c, double *z, double *vals,
                                       double *gate, int *finite_top) {
    const int64_t C = g->c, CS = g->cs, IS = volume(g->in_size);
    const T *v = ts->v, *s = ts->s, *a = ts->a;
    double ac = a[g->ca == C ? c : 0];
    for (int t = 0; t < nt; t++) {
        int64_t j = n * IS + taps[t];
        z[t] = ac * (double)(CS == C ? s[j * C + c] : s[j]);
        vals[t] = v[j * C + c];
    }
    return limit_window(nt, z, vals, gate, finite_top);
}

/* out: (N, *out, C); stats: (2, N, *out, CS), the window max m and 1 / den per lane (m = NaN: a lane
   redone by the limits). Returns how many outputs are not finite. */
int64_t CAT(softmax_pool_forward, SUFFIX)(const gp_geometry *g, const gp_tensors *ts, int threads) {
    const int64_t N = g->n, C = g->c, CS = g->cs, a_per_channel = g->ca == C;
    const int64_t IS = volume(g->in_size), OS = volume(g->out_size), K = volume(g->kernel);
    const T *v = ts->v, *s = ts->s, *a = ts->a;
    T *out = ts->out, *stats = ts->stats;
    int64_t bad = 0;
#pragma omp parallel num_threads(threads) reduction(+ : bad)
    {
        int64_t *taps = malloc(sizeof(int64_t) * K);
        double *z = malloc(sizeof(double) * 3 * K), *vals = z + K, *gate = z + 2 * K;
        T *mx = malloc(sizeof(T) * 3 * C), *den = mx + C, *av = mx + 2 * C; /* av: a per channel */
        for (int64_t c = 0; c < C; c++) av[c] = a[a_per_channel ? c : 0];
#pragma omp for schedule(static)
        for (int64_t no = 0; no < N * OS; no++) {
            int64_t n = no / OS;
            int nt = taps_of(g, no % OS, taps), finite_top, slow = 0;
            T *y = out + no * C, *mm = stats + no * CS, *rd = stats + (N * OS + no) * CS;
            if (CS == C) { /* a score per channel */
                for (int64_t c = 0; c < C; c++) { mx[c] = -INFINITY; den[c] = 0; y[c] = 0; }
                for (int t = 0; t < nt; t++) {
                    const T *sj = s + (n * IS + taps[t]) * C;
#pragma omp simd
                    for (int64_t c = 0; c < C; c++) {
                        T zc = av[c] * sj[c];
                        mx[c] = zc > mx[c] ? zc : mx[c];
                    }
                }
                for (int t = 0; t < nt; t++) {
                    const T *sj = s + (n * IS + taps[t]) * C, *vj = v + (n * IS + taps[t]) * C;
#pragma omp simd
                    for (int64_t c = 0; c < C; c++) {
                        T e = EXP(av[c] * sj[c] - mx[c]);
                        den[c] += e;
                        y[c] += e * vj[c];
                    }
                }
                for (int64_t c = 0; c < C; c++) {
                    rd[c] = 1 / den[c];
                    y[c] *= rd[c];
                    mm[c] = mx[c];
                    slow |= !isfinite(y[c]);
                }
            } else { /* one score per position, shared by the channels */
                T m = -INFINITY, d = 0;
                for (int t = 0; t < nt; t++) {
                    T zt = a[0] * s[n * IS + taps[t]];
                    m = zt > m ? zt : m;
                }
                for (int64_t c = 0; c < C; c++) y[c] = 0;
                for (int t = 0; t < nt; t++) {
                    const T *vj = v + (n * IS + taps[t]) * C;
                    T e = EXP(a[0] * s[n * IS + taps[t]] - m);
                    d += e;
#pragma omp simd
                    for (int64_t c = 0; c < C; c++) y[c] += e * vj[c];
                }
                for (int64_t c = 0; c < C; c++) {
                    y[c] /= d;
                    slow |= !isfinite(y[c]);
                }
                mm[0] = m;
                rd[0] = 1 / d;
            }
            if (!slow) continue;
            for (int64_t c = 0; c < C; c++) { /* non-finite lanes (all of them for shared scores): the limits */
                if (CS == C && isfinite(y[c])) continue;
                y[c] = CAT(limit_lane, SUFFIX)(g, ts, n, taps, nt, c, z, vals, gate, &finite_top);
                if (CS == C) mm[c] = NAN;
                bad += !isfinite(y[c]);
            }
            if (CS != C) mm[0] = NAN;
        }
        free(taps);
        free(z);
        free(mx);
    }
    return bad;
}

/* One tap's gradients over the C lanes of a score-per-channel window (the backward's inner loop).
   has_gs and disjoint are constants at each call, so the branches on them vanish and the loop vectorizes. */
static inline void CAT(backward_lanes, SUFFIX)(int64_t C, const T *av, const T *sj, const T *vj, const T *y,
                                               const T *mm, const T *rd, const T *go, T *gvj, T *gsj,
                                               T *gac, const int has_gs, const int disjoint) {
#pragma omp simd
    for (int64_t c = 0; c < C; c++) {
        T ac = av[c];
        int fast = mm[c] == mm[c]; /* m = NaN: a lane redone by the limits afterwards */
        T gj = fast ? EXP(ac * sj[c] - mm[c]) * rd[c] : 0;
        T push = fast ? gj * (vj[c] - y[c]) * go[c] : 0; /* g_j (v_j − out) G */
        T dv = has_gs ? gj * go[c] : gj * go[c] + ac * push;
        gvj[c] = disjoint ? dv : gvj[c] + dv;
        if (has_gs) gsj[c] = disjoint ? ac * push : gsj[c] + ac * push;
        gac[c] += fast ? push * sj[c] : 0; /* not 0 · inf */
    }
}

/* gv (and gs, unless NULL: soft pooling, where s = v and both gradients go to gv) are filled here;
   ga: (threads × C or threads × 1) partial sums of ∂L/∂a, or NULL when a needs no gradient.
   Where no two windows share an input (tiling windows), each gradient is written once, not zeroed
   and then added to (a third of the memory traffic); inputs no window reads are zeroed. */
void CAT(softmax_pool_backward, SUFFIX)(const gp_geometry *g, const gp_tensors *ts, int threads) {
    const int64_t N = g->n, C = g->c, CS = g->cs, a_per_channel = g->ca == C, AC = g->ca;
    const int64_t IS = volume(g->in_size), OS = volume(g->out_size), K = volume(g->kernel);
    const T *v = ts->v, *s = ts->s, *a = ts->a, *out = ts->out, *stats = ts->stats, *gout = ts->gout;
    T *gv = ts->gv, *gs = ts->gs, *ga = ts->ga;
    char *covered = disjoint_windows(g) ? coverage(g) : NULL; /* NULL: windows overlap, accumulate */
    const int disjoint = covered != NULL;
#pragma omp parallel num_threads(threads)
    {
        int64_t *taps = malloc(sizeof(int64_t) * K);
        double *z = malloc(sizeof(double) * 3 * K), *vals = z + K, *gate = z + 2 * K;
        T *gaw = ga ? ga + (int64_t)THREAD_ID * AC : NULL;
        T *av = malloc(sizeof(T) * 2 * C), *gac = av + C; /* a per channel; ∂L/∂a per channel (CS = C) */
        for (int64_t c = 0; c < C; c++) { av[c] = a[a_per_channel ? c : 0]; gac[c] = 0; }
        if (gaw)
            for (int64_t c = 0; c < AC; c++) gaw[c] = 0;
#pragma omp for schedule(static)
        for (int64_t n = 0; n < N; n++) {
            for (int64_t i = 0; i < IS; i++) {
                if (covered && covered[i]) continue;
                memset(gv + (n * IS + i) * C, 0, sizeof(T) * C);
                if (gs) memset(gs + (n * IS + i) * CS, 0, sizeof(T) * CS);
            }
            for (int64_t o = 0; o < OS; o++) {
                int nt = taps_of(g, o, taps), finite_top, slow = 0;
                const T *y = out + (n * OS + o) * C, *mm = stats + (n * OS + o) * CS;
                const T *rd = stats + (N * OS + n * OS + o) * CS;
                const T *go = gout + (n * OS + o) * C;
                for (int64_t c = 0; c < CS; c++) slow |= isnan(mm[c]);
                if (CS == C) {
                    for (int t = 0; t < nt; t++) {
                        int64_t j = n * IS + taps[t];
                        const T *vj = v + j * C, *sj = s + j * C;
                        T *gvj = gv + j * C, *gsj = gs ? gs + j * C : NULL;
                        /* four loops without branches inside, so that each vectorizes */
                        if (gs && disjoint) CAT(backward_lanes, SUFFIX)(C, av, sj, vj, y, mm, rd, go, gvj, gsj, gac, 1, 1);
                        else if (gs) CAT(backward_lanes, SUFFIX)(C, av, sj, vj, y, mm, rd, go, gvj, gsj, gac, 1, 0);
                        else if (disjoint) CAT(backward_lanes, SUFFIX)(C, av, sj, vj, y, mm, rd, go, gvj, gsj, gac, 0, 1);
                        else CAT(backward_lanes, SUFFIX)(C, av, sj, vj, y, mm, rd, go, gvj, gsj, gac, 0, 0);
                    }
                } else if (!slow) {
                    for (int t = 0; t < nt; t++) {
                        int64_t j = n * IS + taps[t];
                        const T *vj = v + j * C;
                        T *gvj = gv + j * C, gj = EXP(a[0] * s[j] - mm[0]) * rd[0], push = 0;
#pragma omp simd reduction(+ : push)
                        for (int64_t c = 0; c < C; c++) {
                            gvj[c] = (disjoint ? 0 : gvj[c]) + gj * go[c];
                            push += (vj[c] - y[c]) * go[c];
                        }
                        gs[j] = (disjoint ? 0 : gs[j]) + a[0] * gj * push;
                        if (gaw) gaw[0] += gj * push * s[j];
                    }
                }
                if (!slow) continue;
                if (disjoint && CS != C) /* the shared-score window skipped above: its taps unwritten */
                    for (int t = 0; t < nt; t++) {
                        memset(gv + (n * IS + taps[t]) * C, 0, sizeof(T) * C);
                        gs[n * IS + taps[t]] = 0;
                    }
                for (int64_t c = 0; c < C; c++) { /* the lanes the forward redid: the same limits */
                    if (CS == C && mm[c] == mm[c]) continue;
                    double yc = CAT(limit_lane, SUFFIX)(g, ts, n, taps, nt, c, z, vals, gate, &finite_top);
                    double ac = a[a_per_channel ? c : 0];
                    for (int t = 0; t < nt; t++) {
                        if (gate[t] == 0) continue; /* gate 0: no gradient (not 0 · inf) */
                        int64_t j = n * IS + taps[t];
                        gv[j * C + c] += (T)(gate[t] * go[c]);
                        if (!finite_top) continue; /* a hardmax over ±inf: no score or τ gradient */
                        double push = gate[t] * (vals[t] - yc) * go[c];
                        T *gsj = gs ? (CS == C ? gs + j * C + c : gs + j) : gv + j * C + c;
                        *gsj += (T)(ac * push);
                        if (gaw) gaw[a_per_channel ? c : 0] += (T)(push * z[t] / ac);
                    }
                }
            }
        }
        if (gaw && CS == C)
            for (int64_t c = 0; c < C; c++) gaw[a_per_channel ? c : 0] += gac[c];
        free(taps);
        free(z);
        free(av);
    }
    free(covered);
}

#undef CAT
#undef CAT_
