// v1 naive: one thread per row, three passes over the row (max, sum of exp, normalise).
// The reference point: each thread walks its row serially, so neighbouring threads touch
// addresses V floats apart (no coalescing) and the row is read three times from memory.
#include "softmax_common.cuh"

extern "C" __global__ void __launch_bounds__(256)
softmax_naive_f32(const float* __restrict__ x, float* __restrict__ y, long long n_rows, int n_cols) {
    const long long row = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (row >= n_rows) return;
    const float* xr = x + row * n_cols;
    float* yr = y + row * n_cols;

    float m = SOFTMAX_NEG_INF;
    for (int c = 0; c < n_cols; ++c) m = fmaxf(m, xr[c]);
    // An all -inf row gives -inf - -inf = NaN here, matching torch.softmax. The serial sum is
    // accumulated in double: in float, 128K terms added one by one drift by ~1e-4.
    m = exp_reference<FmtF32>(m);
    double s = 0.0;
    for (int c = 0; c < n_cols; ++c) s += softmax_exp<FmtF32>(xr[c], m);
    const RowScale rs = row_scale(s);
    for (int c = 0; c < n_cols; ++c) yr[c] = softmax_normalise<FmtF32>(softmax_exp<FmtF32>(xr[c], m), rs);
}
