/* One query position per row, bfloat16 keys and values read where they lie (the slot buffers), float32 arithmetic:
   the decode attention of engine/models/attention.py in one pass over each row's keys and values.

   The numbers follow torch's CPU flash kernel (what transformers' SDPA runs in bfloat16): scores q.k in float32,
   scaled, masked to -inf; e = exp(score - max) in float32; the sum of the e's in float32; the e's rounded to
   bfloat16 for the product with the values, accumulated in float32; the output divided by the sum and rounded to
   bfloat16 (round to nearest even).

   Compiled on the host at first use with -march=native (engine/kernels/build.py). Without AVX-512 the entry point
   returns -1 and the caller takes torch's ops. */

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

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

/* exp(x) for x <= 0 (Cephes' expf polynomial, ~1 ulp); x below -104 (exp(x) < 2^-150, so 0 in float32), -inf
   included, gives exactly 0 */
INLINE __m512 exp_neg(__m512 x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(-120.0f));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
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

INLINE float dot(const __m512 *q, const uint16_t *k, int n) {
    __m512 a = _mm512_mul_ps(q[0], load_bf16(k));
    for (int i = 1; i < n; i++) a = _mm512_fmadd_ps(q[i], load_bf16(k + 16 * i), a);
    return _mm512_reduce_add_ps(a);
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
    long c = 0;
#ifdef __AVX512BF16__
    __m512bh qp[8];  /* the query as pairs, for the BF16 dot-product instruction (products exact in float32) */
    for (int i = 0; 2 * i < n; i++) qp[i] = (__m512bh)_mm512_loadu_si512((const void *)(q + 32 * i));
#endif
    for (; c + 16 <= t; c += 16) {
        __m512 a[16];
        for (int j = 0; j < 16; j++) {
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
        if (mask) {
            __mmask16 keep = _mm512_test_epi32_mask(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(mask + c))),
                                                    _mm512_set1_epi32(0xff));
            sc = _mm512_mask_blend_ps(keep, ninf, sc);
        }
        _mm512_storeu_ps(s + c, sc);
        vmax = _mm512_max_ps(vmax, sc);
    }
    float m = _mm512_reduce_max_ps(vmax);
    for (; c < t; c++) {
        float x = (mask && !mask[c]) ? -INFINITY : dot(qv, k + c * k_st, n) * scale;
        s[c] = x;
        if (x > m) m = x;
    }
    if (m == -INFINITY) { /* nothing to attend: zeros, where SDPA would give NaN */
        memset(out, 0, sizeof(uint16_t) * 16 * n);
        return;
    }
    __m512 vm = _mm512_set1_ps(m), vsum = _mm512_setzero_ps();
    for (c = 0; c + 16 <= t; c += 16) {
        __m512 e = exp_neg(_mm512_sub_ps(_mm512_loadu_ps(s + c), vm));
        vsum = _mm512_add_ps(vsum, e);
        _mm512_storeu_ps(s + c, round_bf16(e));
    }
    if (c < t) {
        __mmask16 rest = (__mmask16)((1u << (t - c)) - 1);
        __m512 e = exp_neg(_mm512_sub_ps(_mm512_maskz_loadu_ps(rest, s + c), vm));
        e = _mm512_maskz_mov_ps(rest, e);
        vsum = _mm512_add_ps(vsum, e);
        _mm512_mask_storeu_ps(s + c, rest, round_bf16(e));
    }
    float sum = _mm512_reduce_add_ps(vsum);
#ifdef __AVX512BF16__
    if (n % 2 == 0) {
        values_pairs(v, v_st, s, t, acc, n / 2);
    } else
#endif
    {
        for (int i = 0; i < n; i++) acc[i] = _mm512_setzero_ps();
        for (c = 0; c < t; c++) {
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

/* query [rows, kv_heads * groups, d] (strides q_sr, q_sh; d contiguous), key/value [rows, kv_heads, >= t, d]
   (strides *_sr, *_sh, *_st), mask [rows, >= t] bytes (stride m_sr; 0 = masked) or NULL, out [rows, kv_heads *
   groups, d] contiguous. Returns 0, or -1 where this build or d is not served (d a multiple of 16 up to 256). */
int splice_decode_attention_bf16(const uint16_t *q, long q_sr, long q_sh, const uint16_t *k, long k_sr, long k_sh,
                                 long k_st, const uint16_t *v, long v_sr, long v_sh, long v_st, const uint8_t *mask,
                                 long m_sr, uint16_t *out, long rows, long kv_heads, long groups, long d, long t,
                                 float scale) {
#ifdef __AVX512F__
    static __thread float *scratch = NULL;
    static __thread long capacity = 0;
    if (d % 16 != 0 || d > 256 || t < 1) return -1;
    if (t > capacity) {
        float *grown = realloc(scratch, sizeof(float) * (size_t)t);
        if (!grown) return -1;
        scratch = grown;
        capacity = t;
    }
#define CASE(N) case N: attend_all(q, q_sr, q_sh, k, k_sr, k_sh, k_st, v, v_sr, v_sh, v_st, mask, m_sr, out, scratch, \
                                   rows, kv_heads, groups, t, scale, N); return 0;
    switch (d / 16) {
        CASE(1) CASE(2) CASE(3) CASE(4) CASE(5) CASE(6) CASE(7) CASE(8)
        CASE(9) CASE(10) CASE(11) CASE(12) CASE(13) CASE(14) CASE(15) CASE(16)
    }
#undef CASE
#endif
    return -1;
}
