// v2 smem: one block per row, shared-memory tree reductions.
// Adds over v1: the block's threads stride through the row together (coalesced loads) and
// combine their partial max / sum in shared memory. Still three passes over the row.
#include "softmax_common.cuh"

#define SMEM_THREADS 256

extern "C" __global__ void __launch_bounds__(SMEM_THREADS)
softmax_smem_f32(const float* __restrict__ x, float* __restrict__ y, long long n_rows, int n_cols) {
    __shared__ float buf[SMEM_THREADS];
    const int tid = threadIdx.x;
    // Row loop so that any number of rows fits in a grid of bounded size.
    for (long long row = blockIdx.x; row < n_rows; row += gridDim.x) {
        const float* xr = x + row * n_cols;
        float* yr = y + row * n_cols;

        float m = SOFTMAX_NEG_INF;
        for (int c = tid; c < n_cols; c += SMEM_THREADS) m = fmaxf(m, xr[c]);
        buf[tid] = m;
        __syncthreads();
        for (int stride = SMEM_THREADS / 2; stride > 0; stride >>= 1) {
            if (tid < stride) buf[tid] = fmaxf(buf[tid], buf[tid + stride]);
            __syncthreads();
        }
        const float row_max = exp_reference<FmtF32>(buf[0]);  // exp's reference point
        __syncthreads();  // buf[0] is read by all before buf is reused for the sum

        float s = 0.0f;
        for (int c = tid; c < n_cols; c += SMEM_THREADS) s += softmax_exp<FmtF32>(xr[c], row_max);
        buf[tid] = s;
        __syncthreads();
        for (int stride = SMEM_THREADS / 2; stride > 0; stride >>= 1) {
            if (tid < stride) buf[tid] += buf[tid + stride];
            __syncthreads();
        }
        const RowScale rs = row_scale(buf[0]);
        __syncthreads();  // buf[0] is read by all before the next row overwrites buf

        for (int c = tid; c < n_cols; c += SMEM_THREADS)
            yr[c] = softmax_normalise<FmtF32>(softmax_exp<FmtF32>(xr[c], row_max), rs);
    }
}
