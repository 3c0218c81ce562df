/* One or two rows of float32 inputs times a bfloat16 weight, summed in float32: y = x W^T (+ b).
 *
 * For CPUs without BF16 units (engine/models/linear.py): there a bfloat16 weight is otherwise multiplied as its
 * float32 copy, which a step of one row streams from memory whole (SmolLM2: 540 MB a step). Read as bfloat16 and
 * widened in registers (a bfloat16 value is the high half of a float32 one), the weight streams half the bytes.
 *
 * The sums are those of oneDNN's float32 product of the widened weight on AVX2, bit for bit: each output's products
 * are added in the order of the inputs, from zero, in chunks of K_CHUNK inputs whose sums are then added in order,
 * and the bias after them. (A product of two bfloat16 values is exact in float32, so a fused multiply-add rounds as
 * a multiply then an add does.) To add along the inputs while the vector lanes hold eight outputs, the weight comes
 * blocked by eight outputs: wb [out / 8][in][8].
 *
 * Returns 0, or 1 where this build has no AVX2 + FMA path or the shapes are not served (the caller falls back).
 */
#include <stdint.h>

#define K_CHUNK 1024 /* oneDNN's on AVX2 (its float32 GEMM's K blocking for these shapes) */

int splice_small_rows_serves(void) {
#if defined(__AVX2__) && defined(__FMA__)
    return 1;
#else
    return 0;
#endif
}

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>

static inline __m256 widen8(const uint16_t *p) {
    __m128i h = _mm_loadu_si128((const __m128i *)p);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

/* BLOCKS blocks of eight outputs at a time against ROWS input rows: BLOCKS x ROWS sums in flight, each in order. */
#define KERNEL(ROWS, BLOCKS)                                                                                       \
    static long rows##ROWS##_blocks##BLOCKS(const float *x, long xs, const uint16_t *wb, const float *b, float *y, \
                                            long ys, long in, long blocks, long first) {                          \
        long ob = first;                                                                                       \
        for (; ob + BLOCKS <= blocks; ob += BLOCKS) {                                                          \
            __m256 acc[BLOCKS][ROWS];                                                                          \
            for (int j = 0; j < BLOCKS; j++)                                                                   \
                for (int r = 0; r < ROWS; r++) acc[j][r] = _mm256_setzero_ps();                                \
            const uint16_t *w = wb + ob * in * 8;                                                              \
            for (long start = 0; start < in; start += K_CHUNK) {                                               \
                long end = start + K_CHUNK < in ? start + K_CHUNK : in;                                        \
                __m256 part[BLOCKS][ROWS];                                                                     \
                for (int j = 0; j < BLOCKS; j++)                                                               \
                    for (int r = 0; r < ROWS; r++) part[j][r] = _mm256_setzero_ps();                           \
                for (long k = start; k < end; k++) {                                                           \
                    __m256 xv[ROWS];                                                                           \
                    for (int r = 0; r < ROWS; r++) xv[r] = _mm256_broadcast_ss(x + r * xs + k);                \
                    for (int j = 0; j < BLOCKS; j++) {                                                         \
                        __m256 wv = widen8(w + (j * in + k) * 8);                                              \
                        for (int r = 0; r < ROWS; r++) part[j][r] = _mm256_fmadd_ps(wv, xv[r], part[j][r]);    \
                    }                                                                                          \
                }                                                                                              \
                for (int j = 0; j < BLOCKS; j++)                                                               \
                    for (int r = 0; r < ROWS; r++)                                                             \
                        acc[j][r] = _mm256_add_ps(acc[j][r], part[j][r]);                                      \
            }                                                                                                  \
            for (int j = 0; j < BLOCKS; j++) {                                                                 \
                __m256 bias = b ? _mm256_loadu_ps(b + (ob + j) * 8) : _mm256_setzero_ps();                     \
                for (int r = 0; r < ROWS; r++)                                                                 \
                    _mm256_storeu_ps(y + r * ys + (ob + j) * 8, _mm256_add_ps(acc[j][r], bias));               \
            }                                                                                                  \
        }                                                                                                      \
        return ob;                                                                                             \
    }

KERNEL(1, 4)
KERNEL(1, 1)
KERNEL(2, 4)
KERNEL(2, 1)
#endif

/* x [rows, in] float32 (row stride xs), wb the weight [out, in] blocked as [out / 8][in][8] bfloat16, b [out] float32
 * or NULL, y [rows, out] float32 (row stride ys); out a multiple of 8, rows 1 or 2 (from three rows oneDNN's float32
 * product on two threads is as fast: the weight is read once for every row, and the sums grow with the rows). */
int splice_small_rows_bf16(const float *x, long xs, const uint16_t *wb, const float *b, float *y, long ys, long rows,
                           long in, long out) {
#if defined(__AVX2__) && defined(__FMA__)
    if (out % 8 || out < 8 || in < 1)
        return 1;
    long blocks = out / 8;
    switch (rows) {
    case 1: rows1_blocks1(x, xs, wb, b, y, ys, in, blocks, rows1_blocks4(x, xs, wb, b, y, ys, in, blocks, 0)); return 0;
    case 2: rows2_blocks1(x, xs, wb, b, y, ys, in, blocks, rows2_blocks4(x, xs, wb, b, y, ys, in, blocks, 0)); return 0;
    default: return 1;
    }
#else
    (void)x; (void)xs; (void)wb; (void)b; (void)y; (void)ys; (void)rows; (void)in; (void)out;
    return 1;
#endif
}
