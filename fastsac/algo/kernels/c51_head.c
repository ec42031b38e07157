/* The C51 critic's output layer maths per row, for float32: the cross-entropy against the target
 * net's projected distribution with its gradient, and Q with dQ/dlogits. Each replaces ~25 (and
 * ~5) small torch ops per twin and update with one pass over a [rows, atoms] block, on the calling
 * thread (see layer_norm_silu.c for why C, and how it is built).
 *
 * critic_head, per row (atoms n, support c, target logits tl, logits l, target atoms ta):
 *   p* = projection of softmax(tl) placed at clamp(ta, v_min, v_max) onto the support
 *        (fastsac.algo.networks.categorical_projection, the same arithmetic)
 *   loss = -sum_j p*_j log softmax(l)_j,  q = sum_j softmax(l)_j c_j
 *   dlogits = (softmax(l) * sum(p*) - p*) * grad_scale        (d loss / d l, times grad_scale)
 * q_head, per row: q = sum_j softmax(l)_j c_j,  dlogits = softmax(l) * (c - q)
 * critic_head returns the number of NaN target atoms (0: all is well); the caller raises.
 */
#include <stdint.h>
#include <string.h>

#include "exp_f32.h"

static float log_f32(float x) { return __builtin_logf(x); }

/* softmax of a row into out; returns log(sum exp(x - max)) + max (the log-partition). */
static float softmax_row(const float *restrict x, int64_t n, float *restrict out) {
    float m = x[0];
    for (int64_t j = 1; j < n; j++) m = x[j] > m ? x[j] : m;
    float sum = 0.f;
#pragma omp simd reduction(+ : sum)
    for (int64_t j = 0; j < n; j++) {
        out[j] = exp_f32(x[j] - m);
        sum += out[j];
    }
    const float inv = 1.f / sum;
#pragma omp simd
    for (int64_t j = 0; j < n; j++) out[j] *= inv;
    return m + log_f32(sum);
}

int64_t c51_critic_head(const float *restrict target_logits, const float *restrict logits,
                     const float *restrict target_atoms, const float *restrict support, int64_t rows, int64_t n,
                     float v_min, float v_max, float grad_scale, float *restrict loss, float *restrict q,
                     float *restrict dlogits) {
    int64_t nan_atoms = 0;
    const float delta = (v_max - v_min) / (float)(n - 1);
#pragma omp parallel for schedule(static) reduction(+ : nan_atoms) if (rows * n >= PARALLEL_MIN_VALUES)
    for (int64_t r = 0; r < rows; r++) {
        float tp[n], proj[n];
        const float *tl = target_logits + r * n, *l = logits + r * n, *ta = target_atoms + r * n;
        float *dl = dlogits + r * n;
        softmax_row(tl, n, tp);
        memset(proj, 0, sizeof proj);
        float mass = 0.f;
        for (int64_t j = 0; j < n; j++) {
            float a = ta[j] < v_min ? v_min : (ta[j] > v_max ? v_max : ta[j]);
            float b = (a - v_min) / delta;
            b = b < 0.f ? 0.f : (b > (float)(n - 1) ? (float)(n - 1) : b);
            float lower = __builtin_floorf(b);
            lower = lower > (float)(n - 2) ? (float)(n - 2) : lower;
            float up = b - lower;
            /* a NaN atom (NaN survives the clamps above) must not become an index: counted, its
             * mass lands on 0 and 1 as NaN (up is NaN) */
            int64_t k = 0;
            if (lower >= 0.f)
                k = (int64_t)lower;
            else
                nan_atoms++;
            proj[k] += tp[j] * (1.f - up);
            proj[k + 1] += tp[j] * up;
        }
        const float log_z = softmax_row(l, n, dl);        /* dl holds softmax(l) for now */
        float ce = 0.f, qr = 0.f;
        for (int64_t j = 0; j < n; j++) {
            ce -= proj[j] * (l[j] - log_z);
            qr += dl[j] * support[j];
            mass += proj[j];
        }
        loss[r] = ce;
        q[r] = qr;
#pragma omp simd
        for (int64_t j = 0; j < n; j++) dl[j] = (dl[j] * mass - proj[j]) * grad_scale;
    }
    return nan_atoms;
}

void c51_q_head(const float *restrict logits, const float *restrict support, int64_t rows, int64_t n,
                float *restrict q, float *restrict dlogits) {
#pragma omp parallel for schedule(static) if (rows * n >= PARALLEL_MIN_VALUES)
    for (int64_t r = 0; r < rows; r++) {
        float *dl = dlogits + r * n;
        softmax_row(logits + r * n, n, dl);
        float qr = 0.f;
#pragma omp simd reduction(+ : qr)
        for (int64_t j = 0; j < n; j++) qr += dl[j] * support[j];
        q[r] = qr;
#pragma omp simd
        for (int64_t j = 0; j < n; j++) dl[j] *= support[j] - qr;
    }
}
