/*
 * What the native cores share (hostlib/_inacore.c, hostlib/_p2pcore.c): big-endian field
 * access, the monotonic clock, the fast-retransmission threshold and the RFC 6298
 * estimator, each exactly as hostlib.ina's Python (the differential tests hold both
 * cores to it).
 */
#ifndef INALAB_NETCORE_H
#define INALAB_NETCORE_H

#include <math.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

static inline void put16(uint8_t *p, unsigned v) { p[0] = (uint8_t)(v >> 8); p[1] = (uint8_t)v; }

static inline void put32(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)(v >> 24); p[1] = (uint8_t)(v >> 16); p[2] = (uint8_t)(v >> 8); p[3] = (uint8_t)v;
}

static inline unsigned get16(const uint8_t *p) { return ((unsigned)p[0] << 8) | p[1]; }

static inline uint32_t get32(const uint8_t *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}

/* Lanes between host order and the wire's big-endian order, the per-packet copy of
   every INA packet sent and result taken. Built for AVX2 and for the baseline, chosen
   at load time (GCC's function multiversioning), so the loop is vectorized (one byte
   shuffle per 8 lanes) where the CPU can, and the module still loads on any x86-64. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define LANES_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define LANES_CLONES
#endif

LANES_CLONES __attribute__((optimize("O3"), unused))
static void lanes_to_be(uint8_t *dst, const int32_t *src, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        uint32_t v = __builtin_bswap32((uint32_t)src[i]);
        memcpy(dst + 4 * i, &v, 4);
    }
}

LANES_CLONES __attribute__((optimize("O3"), unused))
static void lanes_from_be(int32_t *dst, const uint8_t *src, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        uint32_t v;
        memcpy(&v, src + 4 * i, 4);
        dst[i] = (int32_t)__builtin_bswap32(v);
    }
}

/* Results into an output larger than the caches: the same shuffle, with non-temporal
   stores, which skip reading each destination line before writing it and leave the
   caches to the packets. Measured here (2 vCPUs, 4 MiB L2 each), per 8 KiB packet into a
   cold output: 1.2-1.5 us with ordinary stores, 0.55-0.6 us streamed at 64 MiB, 0.8 us
   at 4 MiB; 1.2 us streamed against 0.7-1.0 us at 1 MiB, where the output stays in the
   cache. Sending and taking a packet of a 64 MiB call (a window of 8) out of place: 1.65
   us ordinary, 1.15 us streamed; in place, where the send has just read the lines the
   result goes to: 1.0 us ordinary, 1.5 us streamed. So only out-of-place calls whose
   output reaches STREAM_MIN_BYTES stream, int32 sums and float32 ones alike. The fence
   makes the weakly ordered stores visible before anything later (the caller reads its
   output). */
#define STREAM_MIN_BYTES (16 << 20)

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define HAVE_STREAM 1

__attribute__((target("avx2"))) static void lanes_from_be_nt(int32_t *dst, const uint8_t *src,
                                                             int64_t n) {
    const __m256i swap = _mm256_setr_epi8(3, 2, 1, 0, 7, 6, 5, 4, 11, 10, 9, 8, 15, 14, 13, 12,
                                          3, 2, 1, 0, 7, 6, 5, 4, 11, 10, 9, 8, 15, 14, 13, 12);
    int64_t i = 0;
    for (; i < n && ((uintptr_t)(dst + i) & 31); i++) { /* to a 32-byte boundary */
        uint32_t v;
        memcpy(&v, src + 4 * i, 4);
        v = __builtin_bswap32(v);
        memcpy(dst + i, &v, 4);
    }
    for (; i + 8 <= n; i += 8) {
        __m256i v = _mm256_loadu_si256((const __m256i *)(src + 4 * i));
        _mm256_stream_si256((__m256i *)(dst + i), _mm256_shuffle_epi8(v, swap));
    }
    for (; i < n; i++) {
        uint32_t v;
        memcpy(&v, src + 4 * i, 4);
        v = __builtin_bswap32(v);
        memcpy(dst + i, &v, 4);
    }
    _mm_sfence();
}

/* dequantize_be's in-range loop (_inacore.c), streamed: the same conversion and the same
   multiplication per lane (cvtdq2ps rounds to nearest as the C conversion does), so the
   same bits. */
__attribute__((target("avx2"))) static void dequantize_be_nt(float *out, const uint8_t *src,
                                                             int64_t n, float scale) {
    const __m256i swap = _mm256_setr_epi8(3, 2, 1, 0, 7, 6, 5, 4, 11, 10, 9, 8, 15, 14, 13, 12,
                                          3, 2, 1, 0, 7, 6, 5, 4, 11, 10, 9, 8, 15, 14, 13, 12);
    const __m256 k = _mm256_set1_ps(scale);
    int64_t i = 0;
    for (; i < n && ((uintptr_t)(out + i) & 31); i++) {
        uint32_t b;
        memcpy(&b, src + 4 * i, 4);
        float v = (float)(int32_t)__builtin_bswap32(b) * scale;
        memcpy(out + i, &v, 4);
    }
    for (; i + 8 <= n; i += 8) {
        __m256i v = _mm256_shuffle_epi8(_mm256_loadu_si256((const __m256i *)(src + 4 * i)), swap);
        _mm256_stream_ps(out + i, _mm256_mul_ps(_mm256_cvtepi32_ps(v), k));
    }
    for (; i < n; i++) {
        uint32_t b;
        memcpy(&b, src + 4 * i, 4);
        float v = (float)(int32_t)__builtin_bswap32(b) * scale;
        memcpy(out + i, &v, 4);
    }
    _mm_sfence();
}
#endif

/* Whether this machine can stream results (lanes_from_be_out); a call streams those of
   an output of at least STREAM_MIN_BYTES (the tests lower that to 0). */
static inline int stream_results(int64_t bytes) {
    (void)bytes;
#ifdef HAVE_STREAM
    return __builtin_cpu_supports("avx2");
#else
    return 0;
#endif
}

/* Lanes from the wire into the caller's output: streamed where stream_results said so. */
__attribute__((unused)) static void lanes_from_be_out(int32_t *dst, const uint8_t *src, int64_t n,
                                                      int stream) {
#ifdef HAVE_STREAM
    if (stream) {
        lanes_from_be_nt(dst, src, n);
        return;
    }
#endif
    (void)stream;
    lanes_from_be(dst, src, n);
}

/* CLOCK_MONOTONIC, the clock time.perf_counter reads on Linux. */
static inline double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* hostlib.ina.reorder_threshold */
static inline int reorder_threshold(int window) {
    int t = window - 1 < 3 ? window - 1 : 3;
    return t < 1 ? 1 : t;
}

/* The RFC 6298 estimator of hostlib.ina._Rtt.update, in the same order of operations. */
typedef struct {
    double rto, srtt, rttvar;
    int64_t samples;
} Rtt;

static inline void rtt_sample(Rtt *r, double rtt, double min_timeout, double max_timeout) {
    if (r->samples == 0) {
        r->srtt = rtt;
        r->rttvar = rtt / 2;
    } else {
        r->rttvar = 0.75 * r->rttvar + 0.25 * fabs(r->srtt - rtt);
        r->srtt = 0.875 * r->srtt + 0.125 * rtt;
    }
    r->samples++;
    double rto = r->srtt + 4 * r->rttvar;
    if (rto < min_timeout) rto = min_timeout;
    if (rto > max_timeout) rto = max_timeout;
    r->rto = rto;
}

#endif
