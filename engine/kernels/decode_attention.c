/* One query position per row, bfloat16 keys and values read where they lie (the slot buffers), float32 arithmetic:
   the decode attention of engine/models/attention.py in one pass over each row's keys and values.

   The numbers follow torch's CPU flash kernel (what transformers' SDPA runs): scores q.k in float32, scaled, masked
   to -inf; e = exp(score - max) in float32; the sum of the e's in float32; the output the e's product with the
   values, accumulated in float32, divided by the sum; as that kernel does, the e's are rounded to bfloat16 for the
   product with the values, and the output to bfloat16 (round to nearest even).

   Compiled on the host at first use with -march=native (engine/kernels/build.py): AVX-512 (with its BF16 dot
   products where the CPU has them), else AVX2 with FMA (8 columns a block, float32 FMAs). Without those the entry
   point returns -1 and the caller takes torch's ops. */

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* exp(x) = 2^n * e^r, n = round(x / ln 2), r = x - n ln 2 (ln 2 in two parts), e^r by Cephes' expf polynomial
   (~1 ulp): both vector widths below evaluate these */
#define EXP_LOG2E 1.44269504088896341f
#define EXP_LN2_HI 0.693359375f
#define EXP_LN2_LO -2.12194440e-4f
#define EXP_P0 1.9875691500e-4f
#define EXP_P1 1.3981999507e-3f
#define EXP_P2 8.3334519073e-3f
#define EXP_P3 4.1665795894e-2f
#define EXP_P4 1.6666665459e-1f
#define EXP_P5 5.0000001201e-1f

#ifdef __AVX512F__
#include <immintrin.h>

#define INLINE static inline __attribute__((always_inline))

INLINE __m512 load_bf16(const uint16_t *p) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
}

/* float32 -> bfloat16 bits, round to nearest even (finite inputs) */
INLINE __m256i to_bf16(__m512 x) {
    __m512i b = _mm512_castps_si512(x);
    __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(b, 16), _mm512_set1_epi32(1));
    b = _mm512_add_epi32(b, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff)));
    return _mm512_cvtepi32_epi16(_mm512_srli_epi32(b, 16));
}

INLINE __m512 round_bf16(__m512 x) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(to_bf16(x)), 16));
}

/* exp(x) for x <= 0; x below -104 (exp(x) < 2^-150, so 0 in float32), -inf
   included, gives exactly 0 */
INLINE __m512 exp_neg(__m512 x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(-120.0f));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(EXP_LOG2E)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(EXP_LN2_HI), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(EXP_LN2_LO), r);
    __m512 p = _mm512_set1_ps(EXP_P0);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(EXP_P1));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(EXP_P2));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(EXP_P3));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(EXP_P4));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(EXP_P5));
    __m512 y = _mm512_add_ps(_mm512_fmadd_ps(_mm512_mul_ps(p, r), r, r), _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(y, n);
}

/* lane j of the result: the sum of a[j]'s 16 lanes */
INLINE __m512 sum16(const __m512 *a) {
    __m512 b[8], c[4], d[2];
    for (int i = 0; i < 8; i++)
        b[i] = _mm512_add_ps(_mm512_unpacklo_ps(a[2 * i], a[2 * i + 1]), _mm512_unpackhi_ps(a[2 * i], a[2 * i + 1]));
    for (int i = 0; i < 4; i++) {
        __m512d x = _mm512_castps_pd(b[2 * i]), y = _mm512_castps_pd(b[2 * i + 1]);
        c[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)), _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)));
    }
    for (int i = 0; i < 2; i++)
        d[i] = _mm512_add_ps(_mm512_shuffle_f32x4(c[2 * i], c[2 * i + 1], 0x88),
                             _mm512_shuffle_f32x4(c[2 * i], c[2 * i + 1], 0xDD));
    return _mm512_add_ps(_mm512_shuffle_f32x4(d[0], d[1], 0x88), _mm512_shuffle_f32x4(d[0], d[1], 0xDD));
}

#ifdef __AVX512BF16__
INLINE uint32_t bits_bf16(float x) { uint32_t b; memcpy(&b, &x, 4); return b >> 16; } /* x already a bfloat16 value */

/* acc[0 .. 2m) = sum over c of w[c] * v[c], the weights bfloat16 values: two columns per BF16 dot-product
   instruction, their values interleaved (unpack works within 128-bit lanes, so the sums come out permuted and are
   put back in order at the end) */
INLINE void values_pairs(const uint16_t *v, long v_st, const float *w, long t, __m512 *acc, int m) {
    __m512 lo[8], hi[8];
    for (int i = 0; i < m; i++) lo[i] = hi[i] = _mm512_setzero_ps();
    long c = 0;
    for (; c < t; c += 2) {
        uint32_t pair = bits_bf16(w[c]) | (c + 1 < t ? bits_bf16(w[c + 1]) << 16 : 0);
        __m512bh wv = (__m512bh)_mm512_set1_epi32((int)pair);
        const uint16_t *v0 = v + c * v_st, *v1 = c + 1 < t ? v0 + v_st : v0;
        for (int i = 0; i < m; i++) {
            __m512i a = _mm512_loadu_si512((const void *)(v0 + 32 * i)), b = _mm512_loadu_si512((const void *)(v1 + 32 * i));
            lo[i] = _mm512_dpbf16_ps(lo[i], wv, (__m512bh)_mm512_unpacklo_epi16(a, b));
            hi[i] = _mm512_dpbf16_ps(hi[i], wv, (__m512bh)_mm512_unpackhi_epi16(a, b));
        }
    }
    /* lo holds elements 0-3, 8-11, 16-19, 24-27 of each 32; hi 4-7, 12-15, 20-23, 28-31 */
    const __m512i first = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
    const __m512i second = _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31);
    for (int i = 0; i < m; i++) {
        acc[2 * i] = _mm512_permutex2var_ps(lo[i], first, hi[i]);
        acc[2 * i + 1] = _mm512_permutex2var_ps(lo[i], second, hi[i]);
    }
}
#endif

/* one query (n * 16 values) against columns [0, t) of one key/value head; s: t floats of scratch */
INLINE void attend(const uint16_t *q, const uint16_t *k, long k_st, const uint16_t *v, long v_st, const uint8_t *mask,
                   uint16_t *out, float *s, long t, float scale, int n) {
    __m512 qv[16], acc[16];
    for (int i = 0; i < n; i++) qv[i] = load_bf16(q + 16 * i);
    const __m512 ninf = _mm512_set1_ps(-INFINITY);
    __m512 vmax = ninf;
#ifdef __AVX512BF16__
    __m512bh qp[8];  /* the query as pairs, for the BF16 dot-product instruction (products exact in float32) */
    for (int i = 0; 2 * i < n; i++) qp[i] = (__m512bh)_mm512_loadu_si512((const void *)(q + 32 * i));
#endif
    /* full and last blocks of 16 columns the same way (the unused lanes zero, then -inf), so that a row's numbers
       do not depend on how many columns a batch's widest row gives it */
    for (long c = 0; c < t; c += 16) {
        int cols = t - c < 16 ? (int)(t - c) : 16;
        __m512 a[16];
        for (int j = 0; j < 16; j++) {
            if (j >= cols) { a[j] = _mm512_setzero_ps(); continue; }
            const uint16_t *kr = k + (c + j) * k_st;
#ifdef __AVX512BF16__
            if (n % 2 == 0) {
                __m512 x = _mm512_dpbf16_ps(_mm512_setzero_ps(), qp[0], (__m512bh)_mm512_loadu_si512((const void *)kr));
                for (int i = 1; 2 * i < n; i++)
                    x = _mm512_dpbf16_ps(x, qp[i], (__m512bh)_mm512_loadu_si512((const void *)(kr + 32 * i)));
                a[j] = x;
                continue;
            }
#endif
            __m512 x = _mm512_mul_ps(qv[0], load_bf16(kr));
            for (int i = 1; i < n; i++) x = _mm512_fmadd_ps(qv[i], load_bf16(kr + 16 * i), x);
            a[j] = x;
        }
        __m512 sc = _mm512_mul_ps(sum16(a), _mm512_set1_ps(scale));
        __mmask16 keep = 0;
        if (cols == 16) {
            keep = mask ? _mm512_test_epi32_mask(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(mask + c))),
                                                 _mm512_set1_epi32(0xff))
                        : (__mmask16)0xffff;
        } else {
            for (int j = 0; j < cols; j++) keep |= (__mmask16)((!mask || mask[c + j]) << j);
        }
        sc = _mm512_mask_blend_ps(keep, ninf, sc);
        _mm512_storeu_ps(s + c, sc);
        vmax = _mm512_max_ps(vmax, sc);
    }
    float m = _mm512_reduce_max_ps(vmax);
    if (m == -INFINITY) { /* nothing to attend: zeros, where SDPA would give NaN */
        memset(out, 0, sizeof(uint16_t) * 16 * n);
        return;
    }
    __m512 vm = _mm512_set1_ps(m), vsum = _mm512_setzero_ps();
    for (long c = 0; c < t; c += 16) { /* the last block's unused lanes are -inf: 0 */
        __m512 e = exp_neg(_mm512_sub_ps(_mm512_loadu_ps(s + c), vm));
        vsum = _mm512_add_ps(vsum, e);
        _mm512_storeu_ps(s + c, round_bf16(e));
    }
    float sum = _mm512_reduce_add_ps(vsum);
#ifdef __AVX512BF16__
    if (n % 2 == 0) {
        values_pairs(v, v_st, s, t, acc, n / 2);
    } else
#endif
    {
        for (int i = 0; i < n; i++) acc[i] = _mm512_setzero_ps();
        for (long c = 0; c < t; c++) {
            const uint16_t *vr = v + c * v_st;
            __m512 w = _mm512_set1_ps(s[c]);
            for (int i = 0; i < n; i++) acc[i] = _mm512_fmadd_ps(w, load_bf16(vr + 16 * i), acc[i]);
        }
    }
    __m512 inv = _mm512_set1_ps(1.0f / sum);
    for (int i = 0; i < n; i++) _mm256_storeu_si256((__m256i *)(out + 16 * i), to_bf16(_mm512_mul_ps(acc[i], inv)));
}

INLINE void attend_all(const uint16_t *q, long q_sr, long q_sh, const uint16_t *k, long k_sr, long k_sh, long k_st,
                       const uint16_t *v, long v_sr, long v_sh, long v_st, const uint8_t *mask, long m_sr,
                       uint16_t *out, float *s, long rows, long kv_heads, long groups, long t, float scale, int n) {
    for (long r = 0; r < rows; r++)
        for (long h = 0; h < kv_heads; h++)
            for (long g = 0; g < groups; g++) {
                long head = h * groups + g;
                attend(q + r * q_sr + head * q_sh, k + r * k_sr + h * k_sh, k_st, v + r * v_sr + h * v_sh, v_st,
                       mask ? mask + r * m_sr : NULL, out + (r * kv_heads * groups + head) * 16 * n, s, t, scale, n);
            }
}
#endif

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>

#define INLINE8 static inline __attribute__((always_inline))

/* 8 bfloat16 values as float32 */
INLINE8 __m256 load8(const uint16_t *p) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
}

/* float32 -> bfloat16 bits in the upper half of each lane, round to nearest even (finite inputs) */
INLINE8 __m256i bf16_bits8(__m256 x) {
    __m256i b = _mm256_castps_si256(x);
    __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(b, 16), _mm256_set1_epi32(1));
    return _mm256_and_si256(_mm256_add_epi32(b, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff))),
                            _mm256_set1_epi32((int)0xffff0000));
}

/* 8 float32 values rounded to bfloat16 at p */
INLINE8 void store8(uint16_t *p, __m256 x) {
    __m256i b = _mm256_srli_epi32(bf16_bits8(x), 16);
    _mm_storeu_si128((__m128i *)p, _mm_packus_epi32(_mm256_castsi256_si128(b), _mm256_extracti128_si256(b, 1)));
}

/* exp(x) for x <= 0; below -87 (exp(x) < 2^-125, which would be subnormal),
   -inf included, exactly 0 */
INLINE8 __m256 exp_neg8(__m256 x) {
    __m256 tiny = _mm256_cmp_ps(x, _mm256_set1_ps(-87.0f), _CMP_LT_OQ);
    x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(EXP_LOG2E)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(EXP_LN2_HI), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(EXP_LN2_LO), r);
    __m256 p = _mm256_set1_ps(EXP_P0);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(EXP_P1));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(EXP_P2));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(EXP_P3));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(EXP_P4));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(EXP_P5));
    __m256 y = _mm256_add_ps(_mm256_fmadd_ps(_mm256_mul_ps(p, r), r, r), _mm256_set1_ps(1.0f));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_andnot_ps(tiny, _mm256_mul_ps(y, _mm256_castsi256_ps(e)));
}

/* lane j of the result: the sum of a[j]'s 8 lanes */
INLINE8 __m256 sum8(const __m256 *a) {
    __m256 c0 = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
    __m256 c1 = _mm256_hadd_ps(_mm256_hadd_ps(a[4], a[5]), _mm256_hadd_ps(a[6], a[7]));
    return _mm256_add_ps(_mm256_permute2f128_ps(c0, c1, 0x20), _mm256_permute2f128_ps(c0, c1, 0x31));
}

INLINE8 float hsum8(__m256 a) {
    __m128 x = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    x = _mm_add_ps(x, _mm_movehl_ps(x, x));
    return _mm_cvtss_f32(_mm_add_ss(x, _mm_movehdup_ps(x)));
}

/* one query (n * 8 values) against columns [0, t) of one key/value head; s: t floats of scratch */
INLINE8 void attend8(const uint16_t *q, const uint16_t *k, long k_st, const uint16_t *v, long v_st,
                     const uint8_t *mask, uint16_t *out, float *s, long t, float scale, int n) {
    __m256 qv[32], acc[32];
    for (int i = 0; i < n; i++) qv[i] = load8(q + 8 * i);
    const __m256 ninf = _mm256_set1_ps(-INFINITY);
    __m256 vmax = ninf;
    /* full and last blocks of 8 columns the same way (the unused lanes zero, then -inf), so that a row's numbers
       do not depend on how many columns a batch's widest row gives it */
    for (long c = 0; c < t; c += 8) {
        int cols = t - c < 8 ? (int)(t - c) : 8;
        __m256 a[8];
        for (int j = 0; j < 8; j++) {
            if (j >= cols) { a[j] = _mm256_setzero_ps(); continue; }
            const uint16_t *kr = k + (c + j) * k_st;
            __m256 x = _mm256_mul_ps(qv[0], load8(kr));
            for (int i = 1; i < n; i++) x = _mm256_fmadd_ps(qv[i], load8(kr + 8 * i), x);
            a[j] = x;
        }
        __m256 sc = _mm256_mul_ps(sum8(a), _mm256_set1_ps(scale));
        __m256i keep;
        if (cols == 8 && mask) {
            keep = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(mask + c)));
        } else {
            int32_t lanes[8];
            for (int j = 0; j < 8; j++) lanes[j] = j < cols && (!mask || mask[c + j]);
            keep = _mm256_loadu_si256((const __m256i *)lanes);
        }
        if (mask || cols < 8)
            sc = _mm256_blendv_ps(sc, ninf, _mm256_castsi256_ps(_mm256_cmpeq_epi32(keep, _mm256_setzero_si256())));
        _mm256_storeu_ps(s + c, sc);
        vmax = _mm256_max_ps(vmax, sc);
    }
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(vmax), _mm256_extractf128_ps(vmax, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    float m = _mm_cvtss_f32(_mm_max_ss(m4, _mm_movehdup_ps(m4)));
    if (m == -INFINITY) { /* nothing to attend: zeros, where SDPA would give NaN */
        memset(out, 0, sizeof(uint16_t) * 8 * n);
        return;
    }
    __m256 vm = _mm256_set1_ps(m), vsum = _mm256_setzero_ps();
    for (long c = 0; c < t; c += 8) { /* the last block's unused lanes are -inf: 0 */
        __m256 e = exp_neg8(_mm256_sub_ps(_mm256_loadu_ps(s + c), vm));
        vsum = _mm256_add_ps(vsum, e);
        _mm256_storeu_ps(s + c, _mm256_castsi256_ps(bf16_bits8(e)));
    }
    float sum = hsum8(vsum);
    for (int i = 0; i < n; i++) acc[i] = _mm256_setzero_ps();
    for (long c = 0; c < t; c++) {
        __m256 w = _mm256_set1_ps(s[c]);
        const uint16_t *vr = v + c * v_st;
        for (int i = 0; i < n; i++) acc[i] = _mm256_fmadd_ps(w, load8(vr + 8 * i), acc[i]);
    }
    __m256 inv = _mm256_set1_ps(1.0f / sum);
    for (int i = 0; i < n; i++) store8(out + 8 * i, _mm256_mul_ps(acc[i], inv));
}

INLINE8 void attend8_all(const uint16_t *q, long q_sr, long q_sh, const uint16_t *k, long k_sr, long k_sh, long k_st,
                         const uint16_t *v, long v_sr, long v_sh, long v_st, const uint8_t *mask, long m_sr,
                         uint16_t *out, float *s, long rows, long kv_heads, long groups, long t, float scale, int n) {
    for (long r = 0; r < rows; r++)
        for (long h = 0; h < kv_heads; h++)
            for (long g = 0; g < groups; g++) {
                long head = h * groups + g;
                attend8(q + r * q_sr + head * q_sh, k + r * k_sr + h * k_sh, k_st, v + r * v_sr + h * v_sh, v_st,
                        mask ? mask + r * m_sr : NULL, out + (r * kv_heads * groups + head) * 8 * n, s, t, scale, n);
            }
}
#endif

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
/* t floats of this thread's scratch and the rest of a last block of 16, or NULL */
static float *scratch_for(long t) {
    static __thread float *scratch = NULL;
    static __thread long capacity = 0;
    t = (t + 15) / 16 * 16;
    if (t > capacity) {
        float *grown = realloc(scratch, sizeof(float) * (size_t)t);
        if (!grown) return NULL;
        scratch = grown;
        capacity = t;
    }
    return scratch;
}
#endif

/* query [rows, kv_heads * groups, d] (strides q_sr, q_sh; d contiguous), key/value [rows, kv_heads, >= t, d]
   (strides *_sr, *_sh, *_st), mask [rows, >= t] bytes (stride m_sr; 0 = masked) or NULL, out [rows, kv_heads *
   groups, d] contiguous; strides in elements. Returns 0, or -1 where this build or d is not served (d a multiple of
   16 up to 256). */
int splice_decode_attention_bf16(const uint16_t *q, long q_sr, long q_sh, const uint16_t *k, long k_sr, long k_sh,
                                 long k_st, const uint16_t *v, long v_sr, long v_sh, long v_st, const uint8_t *mask,
                                 long m_sr, uint16_t *out, long rows, long kv_heads, long groups, long d, long t,
                                 float scale) {
    if (d % 16 != 0 || d > 256 || t < 1) return -1;
#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
    float *s = scratch_for(t);
    if (!s) return -1;
#endif
#ifdef __AVX512F__
#define CASE(N) case N: attend_all(q, q_sr, q_sh, k, k_sr, k_sh, k_st, v, v_sr, v_sh, v_st, mask, m_sr, out, s, \
                                   rows, kv_heads, groups, t, scale, N); return 0;
    switch (d / 16) {
        CASE(1) CASE(2) CASE(3) CASE(4) CASE(5) CASE(6) CASE(7) CASE(8)
        CASE(9) CASE(10) CASE(11) CASE(12) CASE(13) CASE(14) CASE(15) CASE(16)
    }
#undef CASE
#elif defined(__AVX2__) && defined(__FMA__)
    /* d / 8 vectors a query: the usual head sizes unrolled, the others through the same code */
#define CASE(N) case N: attend8_all(q, q_sr, q_sh, k, k_sr, k_sh, k_st, v, v_sr, v_sh, v_st, mask, m_sr, out, s, \
                                    rows, kv_heads, groups, t, scale, N); return 0;
    switch (d / 8) {
        CASE(2) CASE(4) CASE(8) CASE(16)
        default: attend8_all(q, q_sr, q_sh, k, k_sr, k_sh, k_st, v, v_sr, v_sh, v_st, mask, m_sr, out, s, rows,
                             kv_heads, groups, t, scale, (int)(d / 8)); return 0;
    }
#undef CASE
#endif
    return -1;
}

/* 1 where this build serves bfloat16, 0 where its entry point returns -1 */
int splice_decode_attention_serves(void) {
#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
    return 1;
#endif
    return 0;
}
