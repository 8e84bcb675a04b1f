/*
 * What the native cores share (hostlib/_inacore.c, hostlib/_p2pcore.c): big-endian field
 * access, the monotonic clock, the fast-retransmission threshold and the RFC 6298
 * estimator, each exactly as hostlib.ina's Python (the differential tests hold both
 * cores to it); and their run loops' waits and receive batching.
 */
#ifndef INALAB_NETCORE_H
#define INALAB_NETCORE_H

#include <errno.h>
#include <math.h>
#include <poll.h>
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

/* `seconds` (at least 0) as a timespec. */
static inline struct timespec timespec_of(double seconds) {
    struct timespec ts = {(time_t)seconds, (long)((seconds - (double)(time_t)seconds) * 1e9)};
    return ts;
}

/* Wait until `fd` is readable or `seconds` pass (none if not positive); 0, or the errno
   of a failed wait (a signal is not a failure: the caller's loop goes on). */
static inline int wait_readable(int fd, double seconds) {
    if (seconds <= 0) return 0;
    struct timespec ts = timespec_of(seconds);
    struct pollfd p = {fd, POLLIN, 0};
    return ppoll(&p, 1, &ts, NULL) < 0 && errno != EINTR ? errno : 0;
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

/* The RFC 6298 estimator of hostlib.ina._Rtt.update, in the same order of operations;
   `flight` divides the gains (RFC 7323, Appendix G): the samples one round trip brings. */
typedef struct {
    double rto, srtt, rttvar;
    int64_t samples;
} Rtt;

static inline void rtt_sample(Rtt *r, double rtt, double min_timeout, double max_timeout,
                              int64_t flight) {
    if (r->samples == 0) {
        r->srtt = rtt;
        r->rttvar = rtt / 2;
    } else {
        double beta = 0.25 / (double)flight, alpha = 0.125 / (double)flight;
        r->rttvar = (1 - beta) * r->rttvar + beta * fabs(r->srtt - rtt);
        r->srtt = (1 - alpha) * r->srtt + alpha * rtt;
    }
    r->samples++;
    double rto = r->srtt + 4 * r->rttvar;
    if (rto < min_timeout) rto = min_timeout;
    if (rto > max_timeout) rto = max_timeout;
    r->rto = rto;
}

/* hostlib.ina.StallClock: the seconds an engine went unserved during its call, woken
   later than the wake-up it asked for by more than `least` (late_timer * min_timeout). */
typedef struct {
    double seen, stalled, least;
} StallClock;

static inline void stall_init(StallClock *k, double late_timer, double min_timeout) {
    k->seen = 0.0;
    k->stalled = 0.0;
    k->least = late_timer * min_timeout;
}

/* The engine is served at `now`; it had asked to be woken at `asked`. */
static inline void stall_observe(StallClock *k, double now, double asked) {
    double gap = now - (asked > k->seen ? asked : k->seen);
    if (gap > k->least) k->stalled += gap;
    k->seen = now;
}

/* hostlib.ina.RetryPolicy.heartbeat */
static inline double stall_heartbeat(double late_timer, double stall_check) {
    return isfinite(late_timer) ? stall_check : INFINITY;
}

/* Receive batching: run() sleeps for about `count` datagrams' mean spacing before it
   receives, so that one wake-up serves several (hostlib/_inacore.c, BATCH_RESULTS, says
   why and what it saved). The nap never passes `until` (the next timer), never lasts
   over NAP_MAX_S, and is skipped below NAP_MIN_S: a timer's own wake-up would cost what
   it saves, so datagrams closer than NAP_MIN_S / count (fast links) are taken as they
   come. The caller decides when enough is in flight for a nap not to idle the links. */
#define NAP_MIN_S 50e-6
#define NAP_MAX_S 1e-3

typedef struct {
    double gap;     /* mean seconds between datagrams (0: not known yet) */
    double last_rx; /* when the last receive returned datagrams (0: none yet) */
} Spacing;

/* How long to sleep before the next receive; 0: do not. */
static inline double spacing_nap(const Spacing *sp, int count, double until) {
    if (count < 1 || sp->gap <= 0) return 0.0;
    double nap = count * sp->gap;
    if (nap < NAP_MIN_S) return 0.0;
    if (nap > NAP_MAX_S) nap = NAP_MAX_S;
    return nap < until ? nap : (until > 0 ? until : 0.0);
}

/* A receive at `now` returned `n` > 0 datagrams. The mean rises by an eighth of a
   sample's excess, and a sample counts at most twice the mean: a stall (a peer, this
   process, the VM) or the call's start (the ranks do not start together) is not the
   spacing, and naps longer than it called for idle the links while the window drains.
   It falls by `fall` of the difference: a small window has little slack for naps too
   long (INA's 8 packets: a half), a large one absorbs them and gains from fewer
   wake-ups (p2p's 64: an eighth). */
static inline void spacing_sample(Spacing *sp, double now, int n, double fall) {
    if (sp->last_rx > 0) {
        double g = (now - sp->last_rx) / n;
        if (sp->gap <= 0) sp->gap = g;
        else if (g < sp->gap) sp->gap += (g - sp->gap) * fall;
        else sp->gap += ((g > 2 * sp->gap ? 2 * sp->gap : g) - sp->gap) / 8;
    }
    sp->last_rx = now;
}

static inline void nap(double seconds) {
    struct timespec ts = timespec_of(seconds);
    nanosleep(&ts, NULL); /* a signal ends it early: the caller's loop goes on */
}

#endif
