// Helpers shared by the training kernels (softmax_backward.cu, cross_entropy.cu), on top of
// softmax_common.cuh and cluster_common.cuh, which must come first. Header-free like them, and
// pasted in place of its #include line by kernels/cuda_build.py (expand_includes).
//
// The meetings here are general (any number of 32- and 64-bit words per CTA), where the
// forward's (softmax_fused.cu) are specialised to its max and sum.


// ---- a cluster's two meetings per row --------------------------------------------------------
// As in softmax_fused.cu: each CTA pushes its words into a slot of every peer's shared memory with
// st.async, counted in bytes on the peer's mbarrier, then waits on its own barrier and reads the
// C contributions in rank order. Meeting A carries N32 32-bit words per CTA, meeting B N64 64-bit
// words. Each row holds one A then one B meeting, with a block reduction (a __syncthreads) between
// reading A's slots and pushing B's and again between reading B's and pushing the next row's A,
// so a slot is never overwritten before every thread of its CTA has read it. Phase parity is
// the row's count within the CTA, & 1.
template <int C, int N32, int N64>
struct Meet {
    unsigned w32[C * N32];
    long long w64[C * N64];
    unsigned long long bar[2];
};

// Meeting A: this CTA's words v (the same in every thread) to every peer; on return
// mt.w32[c * N32 + k] holds word k of rank c, for every c.
template <int C, int N32, int N64>
__device__ __forceinline__ void meet_a(Meet<C, N32, N64>& mt, const unsigned (&v)[N32], unsigned rank,
                                       unsigned parity) {
    const int tid = threadIdx.x;
    if (tid == 0) mbar_expect_bytes(&mt.bar[0], C * N32 * 4u);
    if (tid < C) {
#pragma unroll
        for (int k = 0; k < N32; ++k) push_b32(&mt.w32[rank * N32 + k], v[k], &mt.bar[0], static_cast<unsigned>(tid));
    }
    mbar_wait(&mt.bar[0], parity);
}

// Meeting B: as meeting A for 64-bit words (mt.w64).
template <int C, int N32, int N64>
__device__ __forceinline__ void meet_b(Meet<C, N32, N64>& mt, const long long (&v)[N64], unsigned rank,
                                       unsigned parity) {
    const int tid = threadIdx.x;
    if (tid == 0) mbar_expect_bytes(&mt.bar[1], C * N64 * 8u);
    if (tid < C) {
#pragma unroll
        for (int k = 0; k < N64; ++k) push_b64(&mt.w64[rank * N64 + k], v[k], &mt.bar[1], static_cast<unsigned>(tid));
    }
    mbar_wait(&mt.bar[1], parity);
}

// As xor_words of cluster_common.cuh, for a value held as fp32.
__device__ __forceinline__ float xor_float(float v, unsigned z) {
    return __uint_as_float(__float_as_uint(v) ^ z);
}

// ---- the exponentials' fixed point, rounded ------------------------------------------------
// As to_fixed of softmax_common.cuh (the row's exp(x - max) in units of 2^-K, the max's own term
// exactly 2^K), but rounded to the nearest unit instead of truncated: no term exceeds 2^K either
// way, and V rounded terms err by at most V / 2 units, in practice about sqrt(V) / 3, where
// truncation loses up to V and V / 2 on average. That bias is what a confident row's loss
// log1p(sum of the others) would otherwise show at large V.
__device__ __forceinline__ long long to_fixed_rn(float e, float scale) { return __float2ll_rn(e * scale); }

// ---- NaN-propagating min (PTX min.NaN, sm_80+), beside softmax_common.cuh's fmax_nan --------
__device__ __forceinline__ float fmin_nan(float a, float b) {
    float r;
    asm("min.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
    return r;
}

// ---- block reductions of two values, and of magnitudes as bits ------------------------------
// As block_max / block_sum_fixed of softmax_common.cuh: every thread gets the result, and `red`
// is owned by this reduction alone (so consecutive reductions need no barrier between them).
template <int NW>
__device__ __forceinline__ void block_max_min_nan(float& mx, float& mn, float2* red) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
        mx = fmax_nan(mx, __shfl_xor_sync(0xffffffffu, mx, off));
        mn = fmin_nan(mn, __shfl_xor_sync(0xffffffffu, mn, off));
    }
    if (NW == 1) return;
    const int lane = threadIdx.x & 31;
    if (lane == 0) red[threadIdx.x >> 5] = make_float2(mx, mn);
    __syncthreads();
    const float2 r = lane < NW ? red[lane] : make_float2(SOFTMAX_NEG_INF, -SOFTMAX_NEG_INF);
    mx = r.x;
    mn = r.y;
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
        mx = fmax_nan(mx, __shfl_xor_sync(0xffffffffu, mx, off));
        mn = fmin_nan(mn, __shfl_xor_sync(0xffffffffu, mn, off));
    }
}

__device__ __forceinline__ unsigned warp_umax(unsigned v) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) v = max(v, __shfl_xor_sync(0xffffffffu, v, off));
    return v;
}
template <int NW>
__device__ __forceinline__ unsigned block_umax(unsigned v, unsigned* red) {
    v = warp_umax(v);
    if (NW == 1) return v;
    const int lane = threadIdx.x & 31;
    if (lane == 0) red[threadIdx.x >> 5] = v;
    __syncthreads();
    v = lane < NW ? red[lane] : 0u;
    return warp_umax(v);
}

template <int NW>
__device__ __forceinline__ void block_sum_fixed2(long long& a, long long& b, longlong2* red) {
    a = warp_sum_fixed(a);
    b = warp_sum_fixed(b);
    if (NW == 1) return;
    const int lane = threadIdx.x & 31;
    if (lane == 0) red[threadIdx.x >> 5] = make_longlong2(a, b);
    __syncthreads();
    const longlong2 r = lane < NW ? red[lane] : make_longlong2(0ll, 0ll);
    a = warp_sum_fixed(r.x);
    b = warp_sum_fixed(r.y);
}

// ---- order-free sums of arbitrary floats ------------------------------------------------------
// The forward's fixed point (softmax_common.cuh) works because every exp(x - max) lies in [0, 1].
// A sum of signed terms of any size (y * dy, w * (x - max)) first needs a bound M >= |term| that
// is itself order-free: the exact max of |term|, or a product of exact maxima. Then, with
// 2^e > M and n terms (2^bits >= n), each term is scaled by 2^(62 - bits - e) and truncated:
// |term| < 2^(62 - bits) units, so n of them stay below 2^62 in magnitude and the int64 sum is
// exact, associative and the same however the terms were grouped. Each term is rounded to the
// nearest unit: at most half a unit, 2^(e + bits - 63) < 2 M n 2^-62, off in all (about 2^-28 M
// at n = 2^17, below the fp32 rounding of M itself), and far less in practice since the
// roundings of many terms cancel. The scale is applied as two power-of-two factors, each exact,
// since 2^(62 - bits - e) reaches 2^188 for the smallest normal M.
//
// Non-finite terms cannot be scaled. If M is +inf the sum is +inf, -inf or NaN according to
// which infinities occur, so each term is counted instead: +inf adds 1, -inf adds 2^32, NaN
// adds both (a row has fewer than 2^31 terms, so the counts never meet). If M is NaN the sum is
// NaN. The magnitude bound arrives as bits (abs_bits), whose unsigned order puts NaN above +inf
// above every finite value, so one unsigned max finds it.
__device__ __forceinline__ unsigned abs_bits(float v) { return __float_as_uint(v) & 0x7fffffffu; }

__device__ __forceinline__ float pow2f(int e) {  // 2^e for -126 <= e <= 127, exactly
    return __int_as_float((127 + e) << 23);
}

struct FreeSum {
    unsigned bound;  // abs_bits of M
    int scale_exp;   // the scale is 2^scale_exp, applied as two factors
    __device__ __forceinline__ FreeSum(unsigned bound_bits, long long n_terms) : bound(bound_bits) {
        const int bits = n_terms > 1 ? 64 - __clzll(n_terms - 1) : 0;
        const int biased = static_cast<int>(min(bound_bits, 0x7f000000u) >> 23);  // finite
        const int e = max(biased, 1) - 126;                                        // M < 2^e
        scale_exp = 62 - bits - e;                                                 // -128 ... 188
    }
    __device__ __forceinline__ bool finite() const { return bound < 0x7f800000u; }
    // One term in fixed point (finite() only), rounded to nearest: still at most 2^(62 - bits)
    // units, and the rounding errors of many terms cancel instead of adding up as truncation's do.
    __device__ __forceinline__ long long fixed(float t) const {
        const int e1 = scale_exp >> 1;
        return __float2ll_rn(t * pow2f(e1) * pow2f(scale_exp - e1));
    }
    // One term as infinity counts (!finite() only).
    static __device__ __forceinline__ long long count(float t) {
        const long long pos = 1ll, neg = 1ll << 32;
        return t != t ? pos + neg : (t == -SOFTMAX_NEG_INF ? pos : (t == SOFTMAX_NEG_INF ? neg : 0ll));
    }
    __device__ __forceinline__ long long term(float t) const { return finite() ? fixed(t) : count(t); }
    // The exact product a * b (finite() only) in fixed point: a * b rounded to fp32 plus its
    // rounding error fma(a, b, -a * b), which is exact (barring flushed denormals) and at most
    // 2^-24 of the product, so a term stays below 2^(62 - bits) (1 + 2^-24) units and n of them
    // below 2^63. The bound M covers a * b as the caller's own a * b expression rounds it; the
    // exact product exceeds that by at most half an ulp, i.e. not past 2^e.
    __device__ __forceinline__ long long fixed_product(float a, float b) const {
        const float p = a * b;
        return fixed(p) + fixed(fmaf(a, b, -p));
    }
    __device__ __forceinline__ long long term_product(float a, float b) const {
        return finite() ? fixed_product(a, b) : count(a * b);
    }
    // The sum as a float, from the int64 total of term() over all terms.
    __device__ __forceinline__ float finish(long long s) const {
        if (finite()) {
            const int e1 = scale_exp >> 1;
            return static_cast<float>(s) * pow2f(-e1) * pow2f(e1 - scale_exp);
        }
        if (bound > 0x7f800000u) return SOFTMAX_NAN;
        const unsigned long long u = static_cast<unsigned long long>(s);
        const bool pos = (u & 0xffffffffull) != 0ull, neg = (u >> 32) != 0ull;
        // Neither: only the bound overflowed (a product bound, as cross-entropy's), not a term;
        // the finite sum is then out of reach and comes out NaN rather than wrong.
        return pos == neg ? SOFTMAX_NAN : (pos ? -SOFTMAX_NEG_INF : SOFTMAX_NEG_INF);
    }
    // The sum as an unevaluated pair hi + lo: hi = finish(s), and lo the part of s that hi's
    // rounding to fp32 dropped (exact in int64, then rounded; 0 when !finite()). Together they
    // carry the fixed point's ~2^-40 relative precision instead of fp32's 2^-24.
    __device__ __forceinline__ float2 finish_pair(long long s) const {
        if (!finite()) return make_float2(finish(s), 0.0f);
        const int e1 = scale_exp >> 1;
        const float hi = __ll2float_rn(s);              // |s| < 2^63, so hi converts back exactly
        const float lo = __ll2float_rn(s - __float2ll_rn(hi));
        return make_float2(hi * pow2f(-e1) * pow2f(e1 - scale_exp), lo * pow2f(-e1) * pow2f(e1 - scale_exp));
    }
};

// ---- softmax backward's output, y * (dy - S), with S = hi + lo ----------------------------------
// Rounded once, nearly: d = dy - hi is split exactly into h + err (TwoSum), so
// dy - S = h + (err - lo) up to a rounding of the small part, and y * h + y * (err - lo) is one
// FMA. Two plain roundings (of dy - S, then of the product) would err by up to y * ulp(S) / 2 +
// ulp(dx) / 2 where dy and S nearly cancel (a confident row: y ~ 1 at the entry whose dy
// dominates S), more than PyTorch's y * dy - y * S, whose rounding of y * dy also enters its S
// and cancels. A non-finite h (an infinite dy or S, a NaN) takes the plain product, as the
// reference's y * (dy - S) does.
__device__ __forceinline__ float softmax_bwd_out(float y, float dy, float2 S) {
    const float h = dy - S.x;
    const float dv = h - dy;
    const float err = (dy - (h - dv)) + (-S.x - dv);
    const float m = y * (err - S.y);
    return fmaf(y, h, fabsf(h) < -SOFTMAX_NEG_INF ? m : 0.0f);
}

// ---- a 16-byte vector from an address that may not be 16-byte aligned -------------------------
// For the second operand of a row (dy beside y): its body is read as vectors when it shares the
// first operand's alignment, element by element otherwise, into the same uint4 form.
template <class Fmt>
__device__ __forceinline__ uint4 load_vec_any(const typename Fmt::T* p, bool aligned) {
    if (aligned) return ld_once(reinterpret_cast<const uint4*>(p));
    if constexpr (sizeof(typename Fmt::T) == 4) {
        return make_uint4(__float_as_uint(ld_once(p)), __float_as_uint(ld_once(p + 1)),
                          __float_as_uint(ld_once(p + 2)), __float_as_uint(ld_once(p + 3)));
    } else {  // 16-bit elements, element 2k in the low half of word k (as Fmt16::unpack reads them)
        unsigned w[4];
#pragma unroll
        for (int k = 0; k < 4; ++k)
            w[k] = static_cast<unsigned>(ld_once(p + 2 * k)) | (static_cast<unsigned>(ld_once(p + 2 * k + 1)) << 16);
        return make_uint4(w[0], w[1], w[2], w[3]);
    }
}

__device__ __forceinline__ bool same_alignment(const void* a, const void* b) {
    return ((reinterpret_cast<softmax_uptr>(a) ^ reinterpret_cast<softmax_uptr>(b)) & 15u) == 0u;
}
