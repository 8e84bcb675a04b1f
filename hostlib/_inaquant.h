/*
 * The native INA core's quantization and result stores (hostlib/_inacore.c includes it
 * after the wire's constants): block exponents, quantization to big-endian int32 lanes
 * and back, rounding exactly as hostlib.quantize does (the differential test holds them
 * to it), and results streamed past the caches where the CPU can. Needs _netcore.h
 * (put32, LANES_CLONES) included first.
 */
#ifndef INALAB_INAQUANT_H
#define INALAB_INAQUANT_H

#include <stdint.h>
#include <string.h>

/* ------------------------------------------------------------- quantization */
/* The largest magnitude of a block, as the bit pattern without the sign: for floats,
   finite or not, the order of those patterns as unsigned integers is the order of the
   magnitudes, NaN above infinity above every finite value (FINITE_BITS_END), and an
   integer maximum vectorizes where a float comparison cannot (it must not lose a NaN).
   One pass both refuses NaN and infinity and gives the block's exponent. */
#define FINITE_BITS_END 0x7F800000u
LANES_CLONES __attribute__((optimize("O3")))
static uint32_t max_magnitude_bits(const float *x, int64_t n) {
    uint32_t m = 0;
    for (int64_t i = 0; i < n; i++) {
        uint32_t b;
        memcpy(&b, &x[i], 4);
        b &= 0x7FFFFFFFu;
        m = b > m ? b : m;
    }
    return m;
}

/* hostlib.quantize.block_exponents of a block whose largest magnitude is `bits`. */
static int8_t block_exponent(uint32_t bits) {
    float m;
    memcpy(&m, &bits, 4);
    if (m == 0.0f) return EXPONENT_MIN;
    int e;
    frexp((double)m, &e);
    e -= 1;
    if (e < EXPONENT_MIN) e = EXPONENT_MIN;
    if (e > EXPONENT_MAX) e = EXPONENT_MAX;
    return (int8_t)e;
}

/* rint(x * 2**shift) as big-endian int32 lanes, as hostlib.quantize.quantize_into
   (vectorized as lanes_to_be: the same IEEE operations per lane, so the same bits). */
LANES_CLONES __attribute__((optimize("O3")))
static void quantize_be(const float *x, int64_t n, int lanes, int shift, uint8_t *dst) {
    if (shift >= F32_SHIFT_MIN && shift <= F32_SHIFT_MAX) {
        float scale = ldexpf(1.0f, shift);
        for (int64_t i = 0; i < n; i++) {
            float q = nearbyintf(x[i] * scale);
            uint32_t v = __builtin_bswap32((uint32_t)(int32_t)q); /* one shuffle per 8 */
            memcpy(dst + 4 * i, &v, 4);
        }
    } else {
        for (int64_t i = 0; i < n; i++) {
            double q = nearbyint(ldexp((double)x[i], shift));
            put32(dst + 4 * i, (uint32_t)(int32_t)q);
        }
    }
    memset(dst + 4 * n, 0, (size_t)(lanes - n) * 4);
}

/* dequantize_be's loop for a scale that is a normal float32 power of two. */
LANES_CLONES __attribute__((optimize("O3")))
static void dequantize_scaled(const uint8_t *src, int64_t n, float scale, float *out) {
    for (int64_t i = 0; i < n; i++) {
        uint32_t b;
        memcpy(&b, src + 4 * i, 4);
        float v = (float)(int32_t)__builtin_bswap32(b); /* float32(sum) first */
        out[i] = v * scale;
    }
}

/* ------------------------------------------------- results streamed past the caches */
/* Results into an output larger than the caches: the same lanes, written with
   non-temporal stores, which skip reading each destination line before writing it and
   leave the caches to the packets. Measured here (2 vCPUs, 4 MiB L2 each), per 8 KiB
   packet into a cold output: 1.2-1.5 us with ordinary stores, 0.55-0.6 us streamed at
   64 MiB, 0.8 us at 4 MiB; 1.2 us streamed against 0.7-1.0 us at 1 MiB, where the output
   stays in the cache. Sending and taking a packet of a 64 MiB call (a window of 8) out of
   place: 1.65 us ordinary, 1.15 us streamed; in place, where the send has just read the
   lines the result goes to: 1.0 us ordinary, 1.5 us streamed. So only out-of-place calls
   whose output reaches STREAM_MIN_BYTES stream, int32 sums and float32 ones alike. The
   lanes before the output's first 32-byte boundary and after its last one go through the
   ordinary loops; the fence makes the weakly ordered stores visible before anything
   later (the caller reads its output). */
#define STREAM_MIN_BYTES (16 << 20)

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define HAVE_STREAM 1

/* Lanes before `p`'s first 32-byte boundary (all `n` when `p` is not 4-byte aligned). */
static inline int64_t lanes_to_boundary(const void *p, int64_t n) {
    int64_t k = 0;
    while (k < n && (((uintptr_t)p + 4 * (uintptr_t)k) & 31)) k++;
    return k;
}

/* Eight big-endian int32 lanes in host order (one byte shuffle). */
__attribute__((target("avx2"))) static inline __m256i load_be32x8(const uint8_t *p) {
    const __m256i swap = _mm256_setr_epi8(3, 2, 1, 0, 7, 6, 5, 4, 11, 10, 9, 8, 15, 14, 13, 12,
                                          3, 2, 1, 0, 7, 6, 5, 4, 11, 10, 9, 8, 15, 14, 13, 12);
    return _mm256_shuffle_epi8(_mm256_loadu_si256((const __m256i *)p), swap);
}

__attribute__((target("avx2"))) static void lanes_from_be_nt(int32_t *dst, const uint8_t *src,
                                                             int64_t n) {
    int64_t i = lanes_to_boundary(dst, n);
    lanes_from_be(dst, src, i);
    for (; i + 8 <= n; i += 8)
        _mm256_stream_si256((__m256i *)(dst + i), load_be32x8(src + 4 * i));
    lanes_from_be(dst + i, src + 4 * i, n - i);
    _mm_sfence();
}

/* dequantize_scaled, streamed: the same conversion and multiplication per lane
   (cvtdq2ps rounds to nearest as the C conversion does), so the same bits. */
__attribute__((target("avx2"))) static void dequantize_scaled_nt(const uint8_t *src, int64_t n,
                                                                 float scale, float *out) {
    const __m256 k = _mm256_set1_ps(scale);
    int64_t i = lanes_to_boundary(out, n);
    dequantize_scaled(src, i, scale, out);
    for (; i + 8 <= n; i += 8)
        _mm256_stream_ps(out + i, _mm256_mul_ps(_mm256_cvtepi32_ps(load_be32x8(src + 4 * i)), k));
    dequantize_scaled(src + 4 * i, n - i, scale, out + i);
    _mm_sfence();
}
#endif

/* Whether this machine can stream results (x86-64 with AVX2). */
static int can_stream(void) {
#ifdef HAVE_STREAM
    return __builtin_cpu_supports("avx2");
#else
    return 0;
#endif
}

/* Lanes from the wire into the caller's output, streamed when `stream`. */
static void lanes_from_be_out(int32_t *dst, const uint8_t *src, int64_t n, int stream) {
#ifdef HAVE_STREAM
    if (stream) {
        lanes_from_be_nt(dst, src, n);
        return;
    }
#endif
    (void)stream;
    lanes_from_be(dst, src, n);
}

/* float32 values of big-endian int32 sums, as hostlib.quantize.dequantize_into;
   streamed when `stream`. */
static void dequantize_be(const uint8_t *src, int64_t n, int shift, float *out, int stream) {
    if (-shift >= F32_SHIFT_MIN && -shift <= F32_SHIFT_MAX) {
        float scale = ldexpf(1.0f, -shift);
#ifdef HAVE_STREAM
        if (stream) {
            dequantize_scaled_nt(src, n, scale, out);
            return;
        }
#endif
        (void)stream;
        dequantize_scaled(src, n, scale, out);
    } else {
        for (int64_t i = 0; i < n; i++)
            out[i] = (float)ldexp((double)(int32_t)get32(src + 4 * i), -shift);
    }
}

#endif
