/*
 * The congestion window of an INA call (hostlib.congestion, the specification), for the
 * native core (_inacore.c): the window's update per round-trip sample, in the same order
 * of operations as hostlib.congestion.CongestionWindow.on_sample, and the heap of
 * packets whose slot is free but which the window holds back (hostlib.ina's _held).
 */
#ifndef INALAB_CONGESTION_H
#define INALAB_CONGESTION_H

#include <math.h>
#include <stdint.h>

/* hostlib.congestion.ROUND_SAMPLES: the fewest samples a round is judged on */
#define CC_ROUND_SAMPLES 8

typedef struct {
    double cwnd;     /* packets; INFINITY: no limit */
    double base_rtt; /* the least round trip seen */
    double round_start; /* when the current round of samples began */
    double round_min;   /* the least sample of the current round */
    int64_t round_samples;
    int64_t cuts;
    double target, beta, max_cut; /* RetryPolicy.cc_target, cc_beta, cc_max_cut */
} CcWindow;

/* CongestionWindow.limit: the packets a call of `window` slots may have in flight. */
static inline int cc_limit(const CcWindow *k, int window) {
    if (k->cwnd >= (double)window) return window;
    int n = (int)k->cwnd;
    return n < 1 ? 1 : n;
}

/* CongestionWindow.on_sample: grow on a sample within the bound, cut on a round whose
   least sample lies above it. */
static inline void cc_sample(CcWindow *k, double rtt, double now, double srtt, int window) {
    if (rtt < k->base_rtt) k->base_rtt = rtt;
    if (rtt < k->round_min) k->round_min = rtt;
    k->round_samples++;
    double w = k->cwnd < (double)window ? k->cwnd : (double)window;
    double bound = k->base_rtt + k->target;
    if (rtt <= bound) {
        w = w + 1.0 / w;
        k->cwnd = w >= (double)window ? INFINITY : w;
    }
    if (now - k->round_start < srtt || k->round_samples < CC_ROUND_SAMPLES) return;
    double least = k->round_min;
    k->round_start = now;
    k->round_min = INFINITY;
    k->round_samples = 0;
    if (least > bound) {
        double factor = 1.0 - k->beta * (least - bound) / least;
        if (factor < 1.0 - k->max_cut) factor = 1.0 - k->max_cut;
        w = w * factor;
        k->cwnd = w > 1.0 ? w : 1.0;
        k->cuts++;
    }
}

/* A min-heap of packet indices, as Python's heapq keeps hostlib.ina's _held (the same
   sift rules are not needed: only the order of pops is observable, and a min-heap of
   distinct indices pops them in ascending order either way). Room for `cap` entries: a
   call holds at most one packet per slot. */
typedef struct {
    int64_t *v;
    int64_t n;
} Held;

static inline void held_push(Held *h, int64_t x) {
    int64_t i = h->n++;
    while (i > 0) {
        int64_t parent = (i - 1) / 2;
        if (h->v[parent] <= x) break;
        h->v[i] = h->v[parent];
        i = parent;
    }
    h->v[i] = x;
}

static inline int64_t held_pop(Held *h) {
    int64_t top = h->v[0], last = h->v[--h->n], i = 0, n = h->n;
    for (;;) {
        int64_t l = 2 * i + 1, r = l + 1, m = i;
        int64_t best = last;
        if (l < n && h->v[l] < best) { m = l; best = h->v[l]; }
        if (r < n && h->v[r] < best) m = r;
        if (m == i) break;
        h->v[i] = h->v[m];
        i = m;
    }
    if (n) h->v[i] = last;
    return top;
}

#endif
