/* LayerNorm (affine) followed by SiLU, forward and backward, for float32 rows: the element-wise
 * part of every hidden layer of fastsac's MLPs, fused into one pass over the data each way.
 *
 * Why C: on a CPU, torch runs LayerNorm and SiLU as separate kernels (plus autograd's backward
 * of each), every one a full read and write of a [batch, width] tensor, and ATen's exp costs
 * ~2 ns per element on AVX2 machines. Here one loop per row computes the row's moments, the
 * normalised value, the affine map and the SiLU, and saves what the backward needs; the backward
 * is one loop per row plus the column sums of the affine parameters' gradients.
 *
 * Built by fastsac/algo/cpu_kernels.py (gcc, -O3, the machine's vector extensions, no fast-math:
 * -ffast-math would link crtfastmath, which sets flush-to-zero for the whole process), loaded
 * with ctypes; each call runs on the calling thread and releases the GIL.
 *
 * Mathematics (per row, width n, eps):
 *   mean = sum(z) / n, var = sum((z - mean)^2) / n, rstd = 1 / sqrt(var + eps)
 *   xhat = (z - mean) * rstd, u = gamma * xhat + beta, s = sigmoid(u), h = u * s
 * backward, from dh:
 *   du = dh * s * (1 + u * (1 - s))                 (d silu / du)
 *   dgamma += du * xhat, dbeta += du, g = du * gamma
 *   dz = rstd * (g - mean(g) - xhat * mean(g * xhat))
 */
#include <stdint.h>

#include "exp_f32.h"

/* h = silu(layer_norm(z)); h may be z (in place: each element is read before it is written).
 * xhat, sig and rstd may be NULL (no backward to come): then only h is written. Otherwise xhat and
 * sig get [rows, width] and rstd [rows]. */
void layer_norm_silu_forward(const float *z, const float *restrict gamma, const float *restrict beta,
                             int64_t rows, int64_t width, float eps, float *h,
                             float *restrict xhat, float *restrict sig, float *restrict rstd) {
#pragma omp parallel for schedule(static) if (rows * width >= PARALLEL_MIN_VALUES)
    for (int64_t r = 0; r < rows; r++) {
        const float *zr = z + r * width;
        float *hr = h + r * width;
        float sum = 0.f, sq = 0.f;
#pragma omp simd reduction(+ : sum)
        for (int64_t i = 0; i < width; i++) sum += zr[i];
        const float mean = sum / (float)width;
#pragma omp simd reduction(+ : sq)
        for (int64_t i = 0; i < width; i++) {
            float d = zr[i] - mean;
            sq += d * d;
        }
        const float rs = 1.f / __builtin_sqrtf(sq / (float)width + eps);
        if (xhat == NULL) {
#pragma omp simd
            for (int64_t i = 0; i < width; i++) {
                float u = gamma[i] * ((zr[i] - mean) * rs) + beta[i];
                hr[i] = u / (1.f + exp_f32(-u));
            }
            continue;
        }
        float *xr = xhat + r * width, *sr = sig + r * width;
        rstd[r] = rs;
#pragma omp simd
        for (int64_t i = 0; i < width; i++) {
            float xh = (zr[i] - mean) * rs;
            float u = gamma[i] * xh + beta[i];
            float s = 1.f / (1.f + exp_f32(-u));
            xr[i] = xh;
            sr[i] = s;
            hr[i] = u * s;
        }
    }
}

/* dz from dh and the forward's xhat, sig, rstd; dz may be dh (in place). dgamma and dbeta are
 * overwritten with their column sums over the rows, and dz_sum (the gradient of the bias of the
 * Linear before) with dz's. */
void layer_norm_silu_backward(const float *dh, const float *restrict xhat, const float *restrict sig,
                              const float *restrict rstd, const float *restrict gamma, const float *restrict beta,
                              int64_t rows, int64_t width, float *dz, float *restrict dgamma,
                              float *restrict dbeta, float *restrict dz_sum) {
    for (int64_t i = 0; i < width; i++) {
        dgamma[i] = 0.f;
        dbeta[i] = 0.f;
        dz_sum[i] = 0.f;
    }
#pragma omp parallel for schedule(static) reduction(+ : dgamma[:width], dbeta[:width], dz_sum[:width]) \
    if (rows * width >= PARALLEL_MIN_VALUES)
    for (int64_t r = 0; r < rows; r++) {
        const float *dhr = dh + r * width, *xr = xhat + r * width, *sr = sig + r * width;
        float *dzr = dz + r * width;
        float sum_g = 0.f, sum_gx = 0.f;
#pragma omp simd reduction(+ : sum_g, sum_gx)
        for (int64_t i = 0; i < width; i++) {
            float u = gamma[i] * xr[i] + beta[i];
            float s = sr[i];
            float du = dhr[i] * s * (1.f + u * (1.f - s));
            dgamma[i] += du * xr[i];
            dbeta[i] += du;
            float g = du * gamma[i];
            dzr[i] = g;
            sum_g += g;
            sum_gx += g * xr[i];
        }
        const float mean_g = sum_g / (float)width, mean_gx = sum_gx / (float)width, rs = rstd[r];
#pragma omp simd
        for (int64_t i = 0; i < width; i++) {
            dzr[i] = rs * (dzr[i] - mean_g - xr[i] * mean_gx);
            dz_sum[i] += dzr[i];
        }
    }
}
