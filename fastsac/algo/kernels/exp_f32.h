/* exp for float32 rows, and when a loop over rows is worth OpenMP's threads, shared by the
 * kernels of fastsac/algo/kernels. */
#ifndef FASTSAC_EXP_F32_H
#define FASTSAC_EXP_F32_H
#include <stdint.h>
#include <string.h>

/* exp(x) for float32 within ~1.3 ulp (Cephes' expf: range reduction by ln 2 and a degree-6
 * polynomial), written without branches or calls so that the row loops vectorise. Inputs are
 * clamped to the finite range of expf; a NaN input stays NaN through the callers' products. */
static inline float exp_f32(float x) {
    x = x < -87.33654f ? -87.33654f : x;
    x = x > 88.37626f ? 88.37626f : x;
    float n = __builtin_floorf(x * 1.44269504088896341f + 0.5f);
    float r = x - n * 0.693359375f + n * 2.12194440e-4f;
    float y = 1.9875691500e-4f;
    y = y * r + 1.3981999507e-3f;
    y = y * r + 8.3334519073e-3f;
    y = y * r + 4.1665795894e-2f;
    y = y * r + 1.6666665459e-1f;
    y = y * r + 5.0000001201e-1f;
    y = y * r * r + r + 1.0f;
    int32_t bits = ((int32_t)n + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return y * scale;
}

/* A loop over rows runs on the calling thread's OpenMP threads (torch's own runtime: the library
 * is linked against libgomp.so.1, which torch has loaded, and torch.set_num_threads sets the
 * count) when it covers at least this many values, as ATen's parallel grain; below, on one. */
#define PARALLEL_MIN_VALUES 32768

#endif
