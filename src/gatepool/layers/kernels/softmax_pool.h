/* The C kernels' boundary: the two structs every caller fills and the functions it calls. Declared here
   once for the C file (softmax_pool.c), the C++ operator (softmax_pool_op.cpp) and, as ctypes copies, for
   Python (c_kernels.py checks its copies against gp_layout() when it loads the library). */
#ifndef GATEPOOL_SOFTMAX_POOL_H
#define GATEPOOL_SOFTMAX_POOL_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Sizes are 3-D: 1-D and 2-D pools have leading spatial sizes of 1 (kernel, stride, dilation 1, padding 0). */
typedef struct {
    int64_t n, c, cs, ca;            /* batch, channels, score channels (c or 1), temperatures (c or 1) */
    int64_t in_size[3], out_size[3]; /* spatial sizes of the input and the output */
    int64_t kernel[3], stride[3], padding[3], dilation[3];
} gp_geometry;

typedef struct { /* channels-last memory, (N, *spatial, channels); NULL where a tensor is absent */
    const void *v, *s, *a;         /* values (.., C), scores (.., CS; s = v for soft pooling), a = 1/τ (CA) */
    const void *w;                 /* score weights (C) or NULL: s_j = w · v_j, computed here (CS = 1, s NULL) */
    void *out, *stats;             /* (N, *out, C), (2, N, *out, CS): the forward writes, the backward reads */
    const void *gout;              /* ∂L/∂out (N, *out, C): the backward's */
    void *gv, *gs, *ga;            /* ∂L/∂v, ∂L/∂s (NULL: soft pooling, into gv), ∂L/∂a (threads × CA or NULL) */
    void *gw;                      /* ∂L/∂w (threads × C) with w: ∂L/∂s_j w goes into gv, ∂L/∂s_j v_j here */
} gp_tensors;

/* Every field of both structs as "struct.field offset size" lines after "struct size" ones, into buf
   (cap bytes); returns the length the whole text needs. */
int64_t gp_layout(char *buf, int64_t cap);

/* The forward writes out and stats and returns how many windows came out non-finite; the backward reads
   them with gout and writes gv, gs, ga, gw. One pair per element type in memory (float16 and bfloat16
   computed in float). threads: OpenMP threads to use. */
#define GP_KERNELS(SUFFIX)                                                                                \
    int64_t softmax_pool_forward_##SUFFIX(const gp_geometry *g, const gp_tensors *ts, int threads);       \
    void softmax_pool_backward_##SUFFIX(const gp_geometry *g, const gp_tensors *ts, int threads);
GP_KERNELS(f32)
GP_KERNELS(f64)
GP_KERNELS(f16)
GP_KERNELS(bf16)
#undef GP_KERNELS

#ifdef __cplusplus
}
#endif

#endif
