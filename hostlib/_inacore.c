/*
 * hostlib._inacore: the native core of a worker's INA allreduce call.
 *
 * Layer: hostlib, under hostlib.native (the binding) and beside hostlib.ina (the Python
 * engine, which is the executable specification). One InaCore is one call of one worker,
 * the same state machine as hostlib.ina.InaAllreduce, transition for transition: the same
 * packets (bytes) for the same events, the same timers, the same fast retransmissions,
 * bit-identical results. Two ways to drive it:
 *
 *   - event by event, from Python (start, on_datagram, on_timer, next_wakeup): what the
 *     fake network does in virtual time, for the differential test against the Python
 *     engine;
 *   - run(fd): the whole call on a connected UDP socket with the GIL released, recvmmsg
 *     and sendmmsg batches, the real clock (CLOCK_MONOTONIC, which time.perf_counter
 *     reads), results written into the caller's buffer as they arrive.
 *
 * Why C and the CPython API (not Cython, pybind11 or cffi): gcc and the Python headers
 * are all it needs, pip builds it from pyproject with the system compiler, and the buffer
 * protocol gives the caller's numpy/torch memory without copies. Nothing per packet is
 * allocated: one buffer per slot of the window (a slot has at most one packet in flight),
 * one receive batch, a timer heap that grows by doubling.
 *
 * The policy stays in Python: the window, the knobs, the retry policy and the session's
 * state across calls (per-slot uses, RTT estimate, next packet number) are passed in and
 * read back.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "_congestion.h"
#include "_netcore.h"

#include <errno.h>
#include <math.h>
#include <poll.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

/* The wire protocol (hostlib/protocol.py; hostlib.native checks these against it). */
#define PROTOCOL_VERSION 1
#define PTYPE_DATA 1
#define PTYPE_RESULT 2
#define HEADER_SIZE 16
#define FLAG_RESEND 0x01
#define POOL_SET_BIT 0x8000
#define EXPONENT_MIN (-128)
#define EXPONENT_MAX 127
#define MAX_LANES 2048
#define SEQ_MODULUS 0xFFFFFFFFLL
#define F32_SHIFT_MIN (-126)
#define F32_SHIFT_MAX 127

#define BATCH 64 /* datagrams per recvmmsg / sendmmsg */
#define SIGNAL_CHECK_S 0.1 /* how often run() takes the GIL to look for signals */

/* Receive batching (_netcore.h). A result wakes a waiting worker: on the emulated star
   at 1 Gbit/s one 8 KiB result every 66 us, each costing the sending context a wake-up
   and the worker a sleep, a poll, a recvmmsg and a sendmmsg for one datagram. So while a
   whole window is in flight, run() first sleeps for about `batch_results` results and
   then takes them in one batch; results wait in the socket's buffer meanwhile, sized to
   the window, and the window keeps the links busy: the nap spans at most half of it (a
   larger batch_results is cut to window / 2), and none is taken in the window's tail, so
   that a call of a few packets never waits.
   Measured (star4, 64 MiB int32, window 8, batch 4): the ranks' CPU per Gbit sent fell
   from 0.330-0.336 to 0.220-0.236, the machine's busy share from 77% to 59-61%, with
   the same call time (0.55-0.57 s); batches of 2: 0.25. */
#define BATCH_RESULTS 4

typedef struct {
    double deadline;
    int32_t slot;
    int64_t index;
} Timer;

typedef struct {
    int64_t tx;
    int32_t slot;
    int64_t index;
} Order;

typedef struct {
    PyObject_HEAD
    /* the job and the call */
    int job_id, rank, num_workers, lanes, window, headroom, is_float;
    int stream; /* results streamed past the caches (lanes_from_be_out, dequantize_be) */
    int64_t count, nblocks, npackets, first_seq;
    Py_buffer data, out, uses;
    int have_data, have_out, have_uses;
    int8_t *local_exp;   /* per block (float32) */
    int8_t *global_exp;  /* per block, from the results (float32) */
    /* policy */
    double min_timeout, max_timeout, backoff, deadline_s, late_timer;
    double heartbeat;     /* RetryPolicy.heartbeat */
    double first_timeout; /* RetryPolicy.timeout: the least before the first result */
    StallClock clock;
    /* the session's RTT estimator (read back by the binding) */
    double rto, srtt, rttvar;
    int64_t samples;
    /* per slot */
    uint8_t *slotbuf; /* window x packet size */
    int64_t *outstanding;
    double *sent_at, *slot_rto, *slot_deadline, *stall_at;
    char *queued, *rearmed;
    int64_t *slot_tx;
    /* hostlib.ina's flagged, _resends, _spurious and _spurious_rtt: results carry the
       RESEND flag of what they answer; per slot, the retransmissions of its packet, and
       a packet resent once that a first transmission completed, with its round trip
       (a slot whose packet has a retransmission is Karn's "resent") */
    int flagged;
    int32_t *resends;
    int64_t *spurious;
    double *spurious_rtt;
    int64_t done, tx, high_tx;
    int reorder;
    double last_progress;
    Timer *heap;
    Py_ssize_t nheap, capheap;
    Order *order;
    Py_ssize_t ohead, otail, ocap; /* ring buffer */
    uint8_t *fastbuf; /* copies of packets found lost, sent by the next on_timer */
    Py_ssize_t nfast, capfast;
    /* statistics */
    int64_t sent, retransmitted, fast_retransmitted, stale, foreign, late_timers, late_samples;
    /* congestion control (hostlib.congestion): the session's window, the packets it
       holds back, which results are in, the oldest packet without its result, and per
       slot whether its packet's round trip is a sample */
    CcWindow cc;
    int cc_on;
    Held held;
    int64_t flight; /* packets sent without their result (hostlib.ina's _flight) */
    char *sample;
    int32_t *released; /* the slots release() let go, for start and on_datagram */
    int batch_results;                /* results a nap waits for in run() (0: never) */
    int64_t naps, receives, received; /* run(): naps, recvmmsg calls, their datagrams */
    size_t psize;
    int started;
} InaCore;

static PyObject *InaCoreError; /* set by the binding: hostlib.ina.InaTimeoutError */

/* ---------------------------------------------------------------- small helpers */

static int headroom_bits(int n) {
    int bits = 0;
    unsigned v = (unsigned)(n - 1);
    while (v) { bits++; v >>= 1; }
    return bits;
}

/* -------------------------------------------------------------- the timer heap */
static int timer_less(const Timer *a, const Timer *b) {
    if (a->deadline != b->deadline) return a->deadline < b->deadline;
    if (a->slot != b->slot) return a->slot < b->slot;
    return a->index < b->index;
}

static int heap_push(InaCore *c, double deadline, int32_t slot, int64_t index) {
    if (c->nheap == c->capheap) {
        Py_ssize_t cap = c->capheap ? 2 * c->capheap : 64;
        Timer *h = realloc(c->heap, (size_t)cap * sizeof(Timer));
        if (!h) return -1;
        c->heap = h;
        c->capheap = cap;
    }
    Py_ssize_t i = c->nheap++;
    Timer t = {deadline, slot, index};
    while (i > 0) {
        Py_ssize_t parent = (i - 1) / 2;
        if (!timer_less(&t, &c->heap[parent])) break;
        c->heap[i] = c->heap[parent];
        i = parent;
    }
    c->heap[i] = t;
    return 0;
}

static Timer heap_pop(InaCore *c) {
    Timer top = c->heap[0];
    Timer last = c->heap[--c->nheap];
    Py_ssize_t i = 0, n = c->nheap;
    for (;;) {
        Py_ssize_t l = 2 * i + 1, r = l + 1, m = i;
        const Timer *best = &last;
        if (l < n && timer_less(&c->heap[l], best)) { m = l; best = &c->heap[l]; }
        if (r < n && timer_less(&c->heap[r], best)) { m = r; }
        if (m == i) break;
        c->heap[i] = c->heap[m];
        i = m;
    }
    if (n) c->heap[i] = last;
    return top;
}

/* ------------------------------------------------------ the transmission order */
static int order_push(InaCore *c, int64_t tx, int32_t slot, int64_t index) {
    Py_ssize_t size = c->otail - c->ohead;
    if (size == c->ocap) {
        Py_ssize_t cap = c->ocap ? 2 * c->ocap : 64;
        Order *o = malloc((size_t)cap * sizeof(Order));
        if (!o) return -1;
        for (Py_ssize_t k = 0; k < size; k++) o[k] = c->order[(c->ohead + k) % (c->ocap ? c->ocap : 1)];
        free(c->order);
        c->order = o;
        c->ocap = cap;
        c->ohead = 0;
        c->otail = size;
    }
    c->order[c->otail % c->ocap] = (Order){tx, slot, index};
    c->otail++;
    return 0;
}

#include "_inaquant.h" /* quantization, results streamed past the caches */

/* ------------------------------------------------------------ the state machine */
static inline int64_t block_len(InaCore *c, int64_t block) {
    int64_t lo = block * c->lanes, hi = lo + c->lanes;
    if (hi > c->count) hi = c->count;
    return hi > lo ? hi - lo : 0;
}

/* One round-trip sample, its gains divided by the packets in flight (hostlib.ina's
   _Rtt.update with flight: RFC 7323, Appendix G). */
static void rtt_update(InaCore *c, double rtt, int64_t flight) {
    Rtt r = {c->rto, c->srtt, c->rttvar, c->samples};
    rtt_sample(&r, rtt, c->min_timeout, c->max_timeout, flight > 1 ? flight : 1);
    c->rto = r.rto;
    c->srtt = r.srtt;
    c->rttvar = r.rttvar;
    c->samples = r.samples;
}

/* Build packet `index` into its slot's buffer (headers, then the payload). */
static void build(InaCore *c, int64_t index) {
    int32_t slot = (int32_t)(index % c->window);
    uint8_t *p = c->slotbuf + (size_t)slot * c->psize;
    const int64_t *uses = (const int64_t *)c->uses.buf;
    int pool_set = (int)((uses[slot] + index / c->window) % 2);
    int64_t seq = (c->first_seq - 1 + index) % SEQ_MODULUS + 1;
    int8_t exp = EXPONENT_MIN;
    if (c->is_float && index < c->nblocks) exp = c->local_exp[index];
    p[0] = (uint8_t)((PROTOCOL_VERSION << 4) | PTYPE_DATA);
    p[1] = 0;
    put16(p + 2, (unsigned)c->job_id);
    p[4] = (uint8_t)c->rank;
    p[5] = (uint8_t)exp;
    put16(p + 6, (unsigned)c->lanes);
    put16(p + 8, (unsigned)(slot | (pool_set ? POOL_SET_BIT : 0)));
    put16(p + 10, 0);
    put32(p + 12, (uint32_t)seq);
    uint8_t *payload = p + HEADER_SIZE;
    int64_t block = c->is_float ? index - c->window : index;
    if (block < 0) {
        memset(payload, 0, (size_t)c->lanes * 4);
        return;
    }
    int64_t n = block_len(c, block);
    if (c->is_float) {
        const float *x = (const float *)c->data.buf + block * c->lanes;
        int shift = 29 - c->global_exp[block] - c->headroom;
        quantize_be(x, n, c->lanes, shift, payload);
    } else {
        const int32_t *x = (const int32_t *)c->data.buf + block * c->lanes;
        lanes_to_be(payload, x, n);
        memset(payload + 4 * n, 0, (size_t)(c->lanes - n) * 4);
    }
}

static int arm(InaCore *c, int32_t slot, int64_t index, double now) {
    c->rearmed[slot] = 0;
    c->stall_at[slot] = c->clock.stalled;
    c->tx++;
    c->slot_tx[slot] = c->tx;
    if (order_push(c, c->tx, slot, index) < 0) return -1;
    double deadline = now + c->slot_rto[slot];
    c->slot_deadline[slot] = deadline;
    return heap_push(c, deadline, slot, index);
}

/* Send packet `index` (built into its slot): returns the slot, -1 on no memory. */
static int32_t send_new(InaCore *c, int64_t index, double now) {
    int32_t slot = (int32_t)(index % c->window);
    c->outstanding[slot] = index;
    c->sent_at[slot] = now;
    c->resends[slot] = 0;
    c->sample[slot] = (char)(c->cc_on && c->done > 0);
    /* Before the call's first result the peers may still be entering the call
       (RetryPolicy.timeout). */
    c->slot_rto[slot] = c->done || c->rto >= c->first_timeout ? c->rto : c->first_timeout;
    if (arm(c, slot, index, now) < 0) return -1;
    c->sent++;
    c->flight++;
    return slot;
}

static int resend(InaCore *c, int32_t slot, int64_t index, double now) {
    c->resends[slot]++;
    if (arm(c, slot, index, now) < 0) return -1;
    c->slotbuf[(size_t)slot * c->psize + 1] |= FLAG_RESEND;
    c->sent++;
    c->retransmitted++;
    return 0;
}

/* A copy of `slot`'s packet for the next on_timer (or run()'s queue_fast). */
static int fast_copy(InaCore *c, int32_t slot) {
    if (c->nfast == c->capfast) { /* grows by doubling: no allocation per packet */
        Py_ssize_t cap = 2 * c->capfast;
        uint8_t *b = realloc(c->fastbuf, (size_t)cap * c->psize);
        if (!b) return -1;
        c->fastbuf = b;
        c->capfast = cap;
    }
    memcpy(c->fastbuf + (size_t)c->nfast * c->psize, c->slotbuf + (size_t)slot * c->psize,
           c->psize);
    c->nfast++;
    return 0;
}

static int detect_losses(InaCore *c, double now) {
    int64_t threshold = c->high_tx - c->reorder;
    while (c->otail > c->ohead) {
        Order o = c->order[c->ohead % c->ocap];
        if (o.tx > threshold) break;
        c->ohead++;
        if (c->outstanding[o.slot] == o.index && c->slot_tx[o.slot] == o.tx) {
            if (resend(c, o.slot, o.index, now) < 0) return -1;
            if (fast_copy(c, o.slot) < 0) return -1;
            c->fast_retransmitted++;
        }
    }
    return 0;
}


/* One received datagram. Returns 0 when it was a result of this call (the packet its
   slot sends next is held: see release), -2 when it was not, -1 when out of memory. */
static int take(InaCore *c, const uint8_t *d, size_t len, double now) {
    if (len != c->psize) { c->foreign++; return -2; }
    if (d[0] != ((PROTOCOL_VERSION << 4) | PTYPE_RESULT) || (int)get16(d + 2) != c->job_id ||
        (int)get16(d + 6) != c->lanes) {
        c->foreign++;
        return -2;
    }
    int8_t exp = (int8_t)d[5];
    int64_t seq = get32(d + 12);
    int64_t index = ((seq - c->first_seq) % SEQ_MODULUS + SEQ_MODULUS) % SEQ_MODULUS;
    int32_t slot = index < c->npackets ? (int32_t)(index % c->window) : -1;
    if (slot < 0 || c->outstanding[slot] != index) {
        c->stale++;
        if (slot >= 0 && c->spurious[slot] == index) { /* a late answer: hostlib.ina's
                                                          _late_sample */
            c->spurious[slot] = -1;
            rtt_update(c, c->spurious_rtt[slot], c->flight);
            c->late_samples++;
        }
        return -2;
    }
    c->outstanding[slot] = -1;
    c->done++;
    c->last_progress = now;
    c->flight--;
    /* Karn's rule, and a result a retransmission completed is ambiguous too */
    int flag = c->flagged ? (d[1] & FLAG_RESEND) : 0;
    c->spurious[slot] = -1;
    if (!c->resends[slot]) {
        if (!flag) {
            double rtt = now - c->sent_at[slot];
            rtt_update(c, rtt, c->flight + 1);
            /* not while this worker stalled: on one machine all stalled, no queue grew */
            if (c->sample[slot] && c->clock.stalled == c->stall_at[slot])
                cc_sample(&c->cc, rtt, now, c->srtt, c->window);
        }
        if (c->slot_tx[slot] > c->high_tx) c->high_tx = c->slot_tx[slot];
    } else if (c->flagged && !flag && c->resends[slot] == 1) {
        c->spurious[slot] = index;
        c->spurious_rtt[slot] = now - c->sent_at[slot];
    }
    int64_t block = c->is_float ? index - c->window : index;
    if (block >= 0) {
        int64_t n = block_len(c, block);
        if (c->is_float) {
            int shift = 29 - c->global_exp[block] - c->headroom;
            float *o = (float *)c->out.buf + block * c->lanes;
            dequantize_be(d + HEADER_SIZE, n, shift, o, c->stream);
        } else {
            int32_t *o = (int32_t *)c->out.buf + block * c->lanes;
            lanes_from_be_out(o, d + HEADER_SIZE, n, c->stream);
        }
    }
    if (c->is_float && index < c->nblocks) c->global_exp[index] = exp;
    if (detect_losses(c, now) < 0) return -1;
    int64_t nxt = index + c->window;
    if (nxt < c->npackets) held_push(&c->held, nxt);
    return 0;
}

/* Build and send packet `index` into its slot (whose buffer the caller has freed). */
static int send_next(InaCore *c, int64_t index, double now) {
    build(c, index);
    return send_new(c, index, now) < 0 ? -1 : 0;
}

/* hostlib.ina.InaAllreduce._escapes: `index`, the lowest held packet, goes beyond the
   congestion window when every packet in flight lies above it. */
static int escapes(const InaCore *c, int64_t index) {
    for (int32_t s = 0; s < c->window; s++) {
        int64_t o = c->outstanding[s];
        if (o >= 0 && o < index) return 0;
    }
    return 1;
}

/* hostlib.ina.InaAllreduce._release: send the held packets the congestion window lets
   go, oldest first; their slots go to `slots` (room for window entries). `ready`, when
   given, is called with each slot before its buffer is rebuilt (run(): a buffer still in
   the send queue is sent first). Returns how many, -1 on no memory or ready's error. */
static Py_ssize_t release(InaCore *c, double now, int32_t *slots,
                          int (*ready)(void *, int32_t), void *arg) {
    int limit = cc_limit(&c->cc, c->window);
    Py_ssize_t k = 0;
    while (c->held.n && (limit >= c->window || c->flight < limit || escapes(c, c->held.v[0]))) {
        int64_t index = held_pop(&c->held);
        int32_t slot = (int32_t)(index % c->window);
        if (ready && ready(arg, slot) != 0) return -1;
        if (send_next(c, index, now) < 0) return -1;
        slots[k++] = slot;
    }
    return k;
}

/* The call's start: every slot's first packet held, then let go as the window allows. */
static Py_ssize_t start_release(InaCore *c, double now, int32_t *slots,
                                int (*ready)(void *, int32_t), void *arg) {
    for (int64_t i = 0; i < c->window; i++) held_push(&c->held, i);
    return release(c, now, slots, ready, arg);
}

/* One datagram taken: the packets it lets go, the first in `*first` (-1: none), the rest
   copied behind the fast retransmissions (as hostlib.ina's on_datagram leaves them to
   on_timer). 0, or -1 on no memory. */
static int take_and_release(InaCore *c, const uint8_t *d, size_t len, double now,
                            int32_t *first, int32_t *slots, int (*ready)(void *, int32_t),
                            void *arg) {
    *first = -1;
    int r = take(c, d, len, now);
    if (r != 0) return r == -1 ? -1 : 0;
    Py_ssize_t k = release(c, now, slots, ready, arg);
    if (k < 0) return -1;
    for (Py_ssize_t i = 1; i < k; i++)
        if (fast_copy(c, slots[i]) < 0) return -1;
    if (k) *first = slots[0];
    return 0;
}

static double next_wakeup(InaCore *c) {
    if (c->nfast) return -INFINITY;
    double deadline = c->last_progress + c->deadline_s;
    double wake = c->nheap && c->heap[0].deadline < deadline ? c->heap[0].deadline : deadline;
    double beat = c->clock.seen + c->heartbeat;
    return beat < wake ? beat : wake;
}

/* Every call into the engine (a datagram, a timer, a wake-up of run()) first observes the
   stall clock against the wake-up the engine had asked for. */
static void observe(InaCore *c, double now) {
    stall_observe(&c->clock, now, next_wakeup(c));
}

/* Expired timers: resend each (its timeout backed off), unless its packet was in flight
   while the worker stalled, which re-arms it once (hostlib.ina.RetryPolicy.late_timer).
   Appends the slots to `slots` (room for window entries... the heap holds at most one
   live timer per slot). Returns the number of slots, -1 on no memory. Fast
   retransmissions stay in fastbuf. */
static Py_ssize_t expire(InaCore *c, double now, int32_t *slots) {
    Py_ssize_t k = 0;
    while (c->nheap && c->heap[0].deadline <= now) {
        Timer t = heap_pop(c);
        if (c->outstanding[t.slot] != t.index || c->slot_deadline[t.slot] != t.deadline)
            continue; /* answered, or re-armed since */
        double slot_rto = c->slot_rto[t.slot];
        double stalled = c->clock.stalled - c->stall_at[t.slot];
        if (!c->rearmed[t.slot] && stalled > c->late_timer * slot_rto) {
            /* Stalled through (RetryPolicy.stalled_through): one timeout more from now. */
            c->rearmed[t.slot] = 1;
            c->slot_deadline[t.slot] = now + slot_rto;
            if (heap_push(c, now + slot_rto, t.slot, t.index) < 0) return -1;
            c->late_timers++;
            continue;
        }
        double rto = slot_rto * c->backoff;
        c->slot_rto[t.slot] = rto < c->max_timeout ? rto : c->max_timeout;
        /* the session's, until an unambiguous sample (RFC 6298) */
        if (c->slot_rto[t.slot] > c->rto) c->rto = c->slot_rto[t.slot];
        if (resend(c, t.slot, t.index, now) < 0) return -1;
        slots[k++] = t.slot;
    }
    return k;
}

static int timed_out(InaCore *c, double now) {
    return now >= c->last_progress + c->deadline_s;
}

static PyObject *timeout_error(InaCore *c, double now) {
    /* The message of hostlib.ina.InaAllreduce._timeout_message, switch named by caller. */
    PyObject *waiting = PyList_New(0);
    if (!waiting) return NULL;
    int64_t *idx = malloc((size_t)c->window * sizeof(int64_t));
    Py_ssize_t n = 0;
    if (idx) {
        for (int s = 0; s < c->window; s++)
            if (c->outstanding[s] >= 0) idx[n++] = c->outstanding[s];
        /* sorted, as sorted() in Python */
        for (Py_ssize_t a = 1; a < n; a++) {
            int64_t v = idx[a];
            Py_ssize_t b = a - 1;
            while (b >= 0 && idx[b] > v) { idx[b + 1] = idx[b]; b--; }
            idx[b + 1] = v;
        }
        for (Py_ssize_t a = 0; a < n; a++) {
            PyObject *v = PyLong_FromLongLong(idx[a]);
            if (!v || PyList_Append(waiting, v) < 0) { Py_XDECREF(v); break; }
            Py_DECREF(v);
        }
        free(idx);
    }
    PyObject *args = Py_BuildValue("(dN)", now - c->last_progress, waiting);
    if (args) {
        PyErr_SetObject(InaCoreError, args);
        Py_DECREF(args);
    }
    return NULL;
}

/* ------------------------------------------------------------- Python type */
static void InaCore_dealloc(InaCore *c) {
    if (c->have_data) PyBuffer_Release(&c->data);
    if (c->have_out) PyBuffer_Release(&c->out);
    if (c->have_uses) PyBuffer_Release(&c->uses);
    free(c->local_exp); free(c->global_exp); free(c->slotbuf); free(c->outstanding);
    free(c->sent_at); free(c->slot_rto); free(c->slot_deadline);
    free(c->resends); free(c->spurious); free(c->spurious_rtt);
    free(c->queued); free(c->rearmed); free(c->stall_at); free(c->slot_tx); free(c->heap);
    free(c->order); free(c->fastbuf); free(c->held.v); free(c->sample);
    free(c->released);
    Py_TYPE(c)->tp_free((PyObject *)c);
}

static int InaCore_init(InaCore *c, PyObject *args, PyObject *kw) {
    static char *names[] = {"job_id", "rank", "num_workers", "lanes", "window", "data",
                            "out", "uses", "first_seq", "rto", "srtt", "rttvar", "samples",
                            "min_timeout", "max_timeout", "backoff", "deadline", "late_timer",
                            "stream_min_bytes", "batch_results", "stall_check", "first_timeout",
                            "cwnd", "base_rtt", "round_start", "round_min", "round_samples", "cuts",
                            "cc_target", "cc_beta", "cc_max_cut", "flagged", NULL};
    PyObject *data, *out, *uses;
    long long first_seq, samples, stream_min = STREAM_MIN_BYTES;
    double stall_check = 0.0025;
    long long cuts = 0, round_samples = 0;
    c->batch_results = BATCH_RESULTS;
    c->first_timeout = 0.0;
    c->cc = (CcWindow){INFINITY, INFINITY, -INFINITY, INFINITY, 0, 0, INFINITY, 0.8, 0.5};
    c->flagged = 1;
    if (!PyArg_ParseTupleAndKeywords(
            args, kw, "iiiiiOOOLdddLddddd|LiddddddLLdddp", names, &c->job_id, &c->rank,
            &c->num_workers, &c->lanes, &c->window, &data, &out, &uses, &first_seq, &c->rto,
            &c->srtt, &c->rttvar, &samples, &c->min_timeout, &c->max_timeout, &c->backoff,
            &c->deadline_s, &c->late_timer, &stream_min, &c->batch_results, &stall_check,
            &c->first_timeout, &c->cc.cwnd, &c->cc.base_rtt, &c->cc.round_start,
            &c->cc.round_min, &round_samples, &cuts, &c->cc.target, &c->cc.beta, &c->cc.max_cut,
            &c->flagged))
        return -1;
    c->cc.cuts = cuts;
    c->cc.round_samples = round_samples;
    c->cc_on = isfinite(c->cc.target);
    if (c->started || c->have_data) {
        PyErr_SetString(PyExc_RuntimeError, "InaCore is initialised once");
        return -1;
    }
    c->first_seq = first_seq;
    c->samples = samples;
    if (c->lanes < 1 || c->lanes > MAX_LANES || c->window < 1 || c->num_workers < 1 ||
        c->batch_results < 0) {
        PyErr_SetString(PyExc_ValueError,
                        "lanes, window, num_workers or batch_results out of range");
        return -1;
    }
    if (PyObject_GetBuffer(data, &c->data, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) return -1;
    c->have_data = 1;
    if (PyObject_GetBuffer(out, &c->out, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE | PyBUF_FORMAT) < 0)
        return -1;
    c->have_out = 1;
    if (PyObject_GetBuffer(uses, &c->uses, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) return -1;
    c->have_uses = 1;
    if (c->data.itemsize != 4 || c->out.itemsize != 4 || c->data.len != c->out.len) {
        PyErr_SetString(PyExc_ValueError, "data and out must be 4-byte elements of one size");
        return -1;
    }
    const char *in0 = c->data.buf, *out0 = c->out.buf;
    int overlap = out0 < in0 + c->data.len && in0 < out0 + c->out.len; /* in place */
    c->stream = stream_min >= 0 && c->out.len >= stream_min && !overlap && can_stream();
    const char *fmt = c->data.format ? c->data.format : "B";
    if (fmt[0] == '=' || fmt[0] == '<' || fmt[0] == '@') fmt++;
    if (strcmp(fmt, "f") == 0) c->is_float = 1;
    else if (strcmp(fmt, "i") == 0 || strcmp(fmt, "l") == 0) c->is_float = 0;
    else {
        PyErr_Format(PyExc_TypeError, "data of format %s: float32 or int32 expected", fmt);
        return -1;
    }
    if (c->uses.itemsize != 8 || c->uses.len / 8 < c->window) {
        PyErr_SetString(PyExc_ValueError, "uses must be int64 with one entry per slot");
        return -1;
    }
    c->count = c->data.len / 4;
    c->nblocks = c->count ? (c->count + c->lanes - 1) / c->lanes : 1;
    if (c->window > c->nblocks) c->window = (int)c->nblocks;
    c->npackets = c->nblocks + (c->is_float ? c->window : 0);
    c->headroom = headroom_bits(c->num_workers);
    c->psize = HEADER_SIZE + 4 * (size_t)c->lanes;
    c->reorder = reorder_threshold(c->window);
    size_t w = (size_t)c->window;
    c->slotbuf = calloc(w, c->psize);
    c->outstanding = malloc(w * sizeof(int64_t));
    c->sent_at = calloc(w, sizeof(double));
    c->slot_rto = calloc(w, sizeof(double));
    c->slot_deadline = calloc(w, sizeof(double));
    c->queued = calloc(w, 1);
    c->rearmed = calloc(w, 1);
    c->stall_at = calloc(w, sizeof(double));
    stall_init(&c->clock, c->late_timer, c->min_timeout);
    c->heartbeat = stall_heartbeat(c->late_timer, stall_check);
    c->slot_tx = calloc(w, sizeof(int64_t));
    c->resends = calloc(w, sizeof(int32_t));
    c->spurious = malloc(w * sizeof(int64_t));
    c->spurious_rtt = calloc(w, sizeof(double));
    c->capfast = (Py_ssize_t)w;
    c->fastbuf = malloc(w * c->psize);
    c->held.v = malloc(w * sizeof(int64_t));
    c->sample = calloc(w, 1);
    c->released = malloc(w * sizeof(int32_t));
    if (c->is_float) {
        c->local_exp = malloc((size_t)c->nblocks);
        c->global_exp = malloc((size_t)c->nblocks);
    }
    if (!c->slotbuf || !c->outstanding || !c->sent_at || !c->slot_rto || !c->slot_deadline ||
        !c->queued || !c->rearmed || !c->stall_at || !c->slot_tx || !c->fastbuf ||
        !c->held.v || !c->sample || !c->released || !c->resends || !c->spurious ||
        !c->spurious_rtt ||
        (c->is_float && (!c->local_exp || !c->global_exp))) {
        PyErr_NoMemory();
        return -1;
    }
    for (size_t s = 0; s < w; s++) c->outstanding[s] = c->spurious[s] = -1;
    if (c->is_float) {
        const float *x = (const float *)c->data.buf;
        for (int64_t b = 0; b < c->nblocks; b++) {
            uint32_t bits = max_magnitude_bits(x + b * c->lanes, block_len(c, b));
            if (bits >= FINITE_BITS_END) {
                PyErr_SetString(PyExc_ValueError, "cannot quantize NaN or infinity");
                return -1;
            }
            c->local_exp[b] = block_exponent(bits);
            c->global_exp[b] = EXPONENT_MIN;
        }
    }
    return 0;
}

static PyObject *packet_bytes(InaCore *c, const uint8_t *p) {
    return PyBytes_FromStringAndSize((const char *)p, (Py_ssize_t)c->psize);
}

static PyObject *InaCore_start(InaCore *c, PyObject *arg) {
    double now = PyFloat_AsDouble(arg);
    if (now == -1.0 && PyErr_Occurred()) return NULL;
    if (c->started) {
        PyErr_SetString(PyExc_RuntimeError, "the call has started already");
        return NULL;
    }
    c->started = 1;
    c->last_progress = now;
    c->clock.seen = now;
    int32_t *slots = c->released;
    Py_ssize_t k = start_release(c, now, slots, NULL, NULL);
    if (k < 0) return PyErr_NoMemory();
    PyObject *list = PyList_New(0);
    for (Py_ssize_t i = 0; list && i < k; i++) {
        PyObject *b = packet_bytes(c, c->slotbuf + (size_t)slots[i] * c->psize);
        if (!b || PyList_Append(list, b) < 0) { Py_XDECREF(b); Py_CLEAR(list); }
        Py_XDECREF(b);
    }
    return list;
}

static PyObject *InaCore_on_datagram(InaCore *c, PyObject *args) {
    Py_buffer d;
    double now;
    if (!PyArg_ParseTuple(args, "y*d", &d, &now)) return NULL;
    observe(c, now);
    int32_t first = -1;
    int r = take_and_release(c, d.buf, (size_t)d.len, now, &first, c->released, NULL, NULL);
    PyBuffer_Release(&d);
    if (r < 0) return PyErr_NoMemory();
    if (first < 0) Py_RETURN_NONE;
    return packet_bytes(c, c->slotbuf + (size_t)first * c->psize);
}

static PyObject *InaCore_on_timer(InaCore *c, PyObject *arg) {
    double now = PyFloat_AsDouble(arg);
    if (now == -1.0 && PyErr_Occurred()) return NULL;
    if (c->done == c->npackets) return PyList_New(0);
    observe(c, now);
    if (timed_out(c, now)) return timeout_error(c, now);
    PyObject *list = PyList_New(0);
    if (!list) return NULL;
    for (Py_ssize_t k = 0; k < c->nfast; k++) {
        PyObject *b = packet_bytes(c, c->fastbuf + (size_t)k * c->psize);
        if (!b || PyList_Append(list, b) < 0) { Py_XDECREF(b); Py_DECREF(list); return NULL; }
        Py_DECREF(b);
    }
    c->nfast = 0;
    int32_t *slots = malloc((size_t)c->window * sizeof(int32_t) * 2 + sizeof(int32_t));
    if (!slots) { Py_DECREF(list); return PyErr_NoMemory(); }
    /* One live timer per slot: at most window expiries per call. */
    Py_ssize_t k = expire(c, now, slots);
    if (k < 0) { free(slots); Py_DECREF(list); return PyErr_NoMemory(); }
    for (Py_ssize_t i = 0; i < k; i++) {
        PyObject *b = packet_bytes(c, c->slotbuf + (size_t)slots[i] * c->psize);
        if (!b || PyList_Append(list, b) < 0) {
            Py_XDECREF(b); free(slots); Py_DECREF(list); return NULL;
        }
        Py_DECREF(b);
    }
    free(slots);
    return list;
}

static PyObject *InaCore_next_wakeup(InaCore *c, PyObject *Py_UNUSED(ignored)) {
    return PyFloat_FromDouble(next_wakeup(c));
}

/* ------------------------------------------------------- the whole call on a socket */
typedef struct {
    InaCore *c;
    int fd;
    struct mmsghdr smsg[BATCH];
    struct iovec siov[BATCH];
    int32_t sslot[BATCH]; /* the slot whose buffer an entry sends, -1: a fastbuf copy */
    unsigned nq;
    int err; /* slot_ready's */
} SendQueue;

/* Send every queued datagram; a full socket buffer waits for room. 0 or an errno. */
static int flush(SendQueue *q) {
    InaCore *c = q->c;
    unsigned off = 0;
    while (off < q->nq) {
        int n = sendmmsg(q->fd, q->smsg + off, q->nq - off, 0);
        if (n < 0) {
            if (errno == EAGAIN || errno == ENOBUFS) {
                struct pollfd p = {q->fd, POLLOUT, 0};
                poll(&p, 1, 10);
                continue;
            }
            if (errno == ECONNREFUSED) { off++; continue; } /* as if lost: timers recover */
            if (errno == EINTR) continue;
            return errno;
        }
        off += (unsigned)n;
    }
    for (unsigned k = 0; k < q->nq; k++)
        if (q->sslot[k] >= 0) c->queued[q->sslot[k]] = 0;
    q->nq = 0;
    return 0;
}

static int enqueue(SendQueue *q, uint8_t *p, int32_t slot) {
    if (q->nq == BATCH) {
        int err = flush(q);
        if (err) return err;
    }
    unsigned k = q->nq++;
    q->siov[k].iov_base = p;
    q->siov[k].iov_len = q->c->psize;
    memset(&q->smsg[k], 0, sizeof(q->smsg[k]));
    q->smsg[k].msg_hdr.msg_iov = &q->siov[k];
    q->smsg[k].msg_hdr.msg_iovlen = 1;
    q->sslot[k] = slot;
    if (slot >= 0) q->c->queued[slot] = 1;
    return 0;
}

static int enqueue_slot(SendQueue *q, int32_t slot) {
    return enqueue(q, q->c->slotbuf + (size_t)slot * q->c->psize, slot);
}

/* release()'s `ready`: a slot's buffer still in the queue is sent before it is rebuilt;
   the error stays in q->err. */
static int slot_ready(void *arg, int32_t slot) {
    SendQueue *q = arg;
    if (q->c->queued[slot]) q->err = flush(q);
    return q->err;
}

/* Packets let go (release): queued in order. ENOMEM, a send's errno, or 0. */
static int queue_released(SendQueue *q, Py_ssize_t k, const int32_t *slots) {
    if (k < 0) return q->err ? q->err : ENOMEM;
    int err = 0;
    for (Py_ssize_t i = 0; i < k && !err; i++) err = enqueue_slot(q, slots[i]);
    return err;
}

/* Fast retransmissions found by the last datagram: sent at once (their copies live in
   fastbuf, which may grow, so they never wait in the queue across datagrams). */
static int queue_fast(SendQueue *q) {
    InaCore *c = q->c;
    if (!c->nfast) return 0;
    for (Py_ssize_t k = 0; k < c->nfast; k++) {
        int err = enqueue(q, c->fastbuf + (size_t)k * c->psize, -1);
        if (err) return err;
    }
    int err = flush(q);
    c->nfast = 0; /* sent: fastbuf is free again */
    return err;
}

/* How long run() sleeps before its next receive (BATCH_RESULTS); 0: no nap. */
static double nap_seconds(const InaCore *c, int results, const Spacing *sp, double until) {
    int64_t left = c->npackets - c->done;
    int64_t limit = cc_limit(&c->cc, c->window);
    int64_t flight = left < limit ? left : limit;
    return flight < 2 * (int64_t)results ? 0.0 : spacing_nap(sp, results, until);
}

enum { RUN_OK = 0, RUN_TIMEOUT = -1, RUN_SIGNAL = -2 };

static int run_loop(InaCore *c, int fd, uint8_t *rbuf, size_t rsize, double *now_out) {
    SendQueue *q = calloc(1, sizeof(SendQueue));
    struct mmsghdr *rmsg = calloc(BATCH, sizeof(struct mmsghdr));
    struct iovec *riov = calloc(BATCH, sizeof(struct iovec));
    int32_t *slots = malloc((size_t)c->window * sizeof(int32_t));
    int err = 0;
    if (!q || !rmsg || !riov || !slots) { err = ENOMEM; goto out; }
    q->c = c;
    q->fd = fd;
    for (int k = 0; k < BATCH; k++) {
        riov[k].iov_base = rbuf + (size_t)k * rsize;
        riov[k].iov_len = rsize;
        rmsg[k].msg_hdr.msg_iov = &riov[k];
        rmsg[k].msg_hdr.msg_iovlen = 1;
    }
    double now = now_s();
    c->started = 1;
    c->last_progress = now;
    c->clock.seen = now;
    err = queue_released(q, start_release(c, now, slots, slot_ready, q), slots);
    if (!err) err = flush(q);
    double check_at = now + SIGNAL_CHECK_S;
    Spacing sp = {0.0, 0.0};
    int nap_results = c->batch_results < c->window / 2 ? c->batch_results : c->window / 2;
    while (!err && c->done < c->npackets) {
        double wake = next_wakeup(c);
        now = now_s();
        double until = (wake < check_at ? wake : check_at) - now;
        double pause_s = nap_seconds(c, nap_results, &sp, until);
        if (pause_s > 0) {
            nap(pause_s);
            c->naps++;
            now = now_s();
            until = (wake < check_at ? wake : check_at) - now;
        }
        err = wait_readable(fd, until);
        if (err) break;
        int n = recvmmsg(fd, rmsg, BATCH, MSG_DONTWAIT, NULL);
        if (n < 0) {
            if (errno != EAGAIN && errno != ECONNREFUSED && errno != EINTR) { err = errno; break; }
            n = 0;
        }
        now = now_s();
        observe(c, now);
        if (n > 0) {
            spacing_sample(&sp, now, n, 0.5);
            c->receives++;
            c->received += n;
        }
        for (int k = 0; k < n && !err; k++) {
            int32_t first;
            if (take_and_release(c, rbuf + (size_t)k * rsize, rmsg[k].msg_len, now, &first,
                                 slots, slot_ready, q) < 0) {
                err = q->err ? q->err : ENOMEM;
                break;
            }
            if (first >= 0) err = enqueue_slot(q, first);
            if (!err) err = queue_fast(q);
        }
        if (!err) err = flush(q);
        if (err || c->done == c->npackets) break;
        if (now >= next_wakeup(c)) {
            if (timed_out(c, now)) { err = RUN_TIMEOUT; break; }
            Py_ssize_t k = expire(c, now, slots);
            if (k < 0) { err = ENOMEM; break; }
            for (Py_ssize_t i = 0; i < k && !err; i++) err = enqueue_slot(q, slots[i]);
            if (!err) err = flush(q);
        }
        if (now >= check_at) {
            check_at = now + SIGNAL_CHECK_S;
            PyGILState_STATE g = PyGILState_Ensure();
            int sig = PyErr_CheckSignals();
            if (sig < 0) err = RUN_SIGNAL; /* the exception stays set */
            PyGILState_Release(g);
        }
    }
    *now_out = now;
out:
    free(q); free(rmsg); free(riov); free(slots);
    return err;
}

static PyObject *InaCore_run(InaCore *c, PyObject *arg) {
    int fd = (int)PyLong_AsLong(arg);
    if (fd == -1 && PyErr_Occurred()) return NULL;
    if (c->started) {
        PyErr_SetString(PyExc_RuntimeError, "the call has started already");
        return NULL;
    }
    size_t rsize = c->psize + 64; /* longer datagrams show as foreign, not truncated */
    uint8_t *rbuf = malloc(BATCH * rsize);
    if (!rbuf) return PyErr_NoMemory();
    double now = 0.0;
    int err;
    Py_BEGIN_ALLOW_THREADS
    err = run_loop(c, fd, rbuf, rsize, &now);
    Py_END_ALLOW_THREADS
    free(rbuf);
    if (err == RUN_OK) Py_RETURN_NONE;
    if (err == RUN_TIMEOUT) return timeout_error(c, now);
    if (err == RUN_SIGNAL) return NULL;
    if (err == ENOMEM) return PyErr_NoMemory();
    errno = err;
    return PyErr_SetFromErrno(PyExc_OSError);
}

/* -------------------------------------------------------------- attributes */
static PyObject *InaCore_get_done(InaCore *c, void *Py_UNUSED(x)) {
    return PyBool_FromLong(c->done == c->npackets);
}

static PyObject *state_counters(InaCore *c);

/* A float into a dict (the state's congestion window), 0 or -1. */
static int put_float(PyObject *d, const char *key, double v) {
    PyObject *o = PyFloat_FromDouble(v);
    int r = o ? PyDict_SetItemString(d, key, o) : -1;
    Py_XDECREF(o);
    return r;
}

static PyObject *InaCore_get_state(InaCore *c, void *Py_UNUSED(x)) {
    PyObject *d = state_counters(c);
    if (!d) return NULL;
    PyObject *cuts = PyLong_FromLongLong(c->cc.cuts);
    PyObject *round_samples = PyLong_FromLongLong(c->cc.round_samples);
    if (!cuts || !round_samples || PyDict_SetItemString(d, "cuts", cuts) < 0 ||
        PyDict_SetItemString(d, "round_samples", round_samples) < 0 ||
        put_float(d, "cwnd", c->cc.cwnd) < 0 || put_float(d, "base_rtt", c->cc.base_rtt) < 0 ||
        put_float(d, "round_start", c->cc.round_start) < 0 ||
        put_float(d, "round_min", c->cc.round_min) < 0) {
        Py_XDECREF(cuts);
        Py_XDECREF(round_samples);
        Py_DECREF(d);
        return NULL;
    }
    Py_DECREF(cuts);
    Py_DECREF(round_samples);
    return d;
}

static PyObject *state_counters(InaCore *c) {
    return Py_BuildValue(
        "{s:L,s:L,s:i,s:d,s:d,s:d,s:L,s:L,s:L,s:L,s:L,s:L,s:L,s:L,s:L,s:O,s:L,s:L,s:L}",
        "npackets",
        (long long)c->npackets, "nblocks", (long long)c->nblocks, "window", c->window, "rto",
        c->rto, "srtt", c->srtt, "rttvar", c->rttvar, "samples", (long long)c->samples, "sent",
        (long long)c->sent, "retransmitted", (long long)c->retransmitted, "fast_retransmitted",
        (long long)c->fast_retransmitted, "stale", (long long)c->stale, "foreign",
        (long long)c->foreign, "done", (long long)c->done, "late_timers",
        (long long)c->late_timers, "late_samples", (long long)c->late_samples, "stream", c->stream ? Py_True : Py_False, "naps",
        (long long)c->naps, "receives", (long long)c->receives, "received",
        (long long)c->received);
}

static PyMethodDef InaCore_methods[] = {
    {"start", (PyCFunction)InaCore_start, METH_O, "start(now) -> the first window's packets"},
    {"on_datagram", (PyCFunction)InaCore_on_datagram, METH_VARARGS,
     "on_datagram(data, now) -> the next packet or None"},
    {"on_timer", (PyCFunction)InaCore_on_timer, METH_O,
     "on_timer(now) -> packets to send again (raises the binding's timeout error)"},
    {"next_wakeup", (PyCFunction)InaCore_next_wakeup, METH_NOARGS, "when on_timer has work"},
    {"run", (PyCFunction)InaCore_run, METH_O,
     "run(fd): the whole call on a connected UDP socket, the GIL released"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef InaCore_getset[] = {
    {"done", (getter)InaCore_get_done, NULL, "every packet's result arrived", NULL},
    {"state", (getter)InaCore_get_state, NULL, "counters and the RTT estimate", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject InaCoreType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "hostlib._inacore.InaCore",
    .tp_basicsize = sizeof(InaCore),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "One worker's INA allreduce call (hostlib.ina.InaAllreduce's state machine).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)InaCore_init,
    .tp_dealloc = (destructor)InaCore_dealloc,
    .tp_methods = InaCore_methods,
    .tp_getset = InaCore_getset,
};

static PyObject *set_timeout_error(PyObject *Py_UNUSED(m), PyObject *cls) {
    Py_XSETREF(InaCoreError, Py_NewRef(cls));
    Py_RETURN_NONE;
}

static PyMethodDef module_methods[] = {
    {"set_timeout_error", set_timeout_error, METH_O,
     "the exception class run() and on_timer() raise with (seconds, waiting indices)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "hostlib._inacore",
    "The native core of a worker's INA allreduce call (see hostlib.native).", -1,
    module_methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__inacore(void) {
    if (PyType_Ready(&InaCoreType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    InaCoreError = Py_NewRef(PyExc_TimeoutError);
    if (PyModule_AddObjectRef(m, "InaCore", (PyObject *)&InaCoreType) < 0) { Py_DECREF(m); return NULL; }
    PyObject *proto = Py_BuildValue(
        "{s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:L}", "PROTOCOL_VERSION", PROTOCOL_VERSION,
        "DATA", PTYPE_DATA, "RESULT", PTYPE_RESULT, "HEADER_SIZE", HEADER_SIZE, "FLAG_RESEND",
        FLAG_RESEND, "POOL_SET_BIT", POOL_SET_BIT, "EXPONENT_MIN", EXPONENT_MIN, "EXPONENT_MAX",
        EXPONENT_MAX, "MAX_LANES", MAX_LANES, "SEQ_MODULUS", (long long)SEQ_MODULUS);
    if (!proto || PyModule_AddObject(m, "PROTOCOL", proto) < 0) { Py_XDECREF(proto); Py_DECREF(m); return NULL; }
    PyObject *all = Py_BuildValue("[sss]", "InaCore", "PROTOCOL", "set_timeout_error");
    if (!all || PyModule_AddObject(m, "__all__", all) < 0) { Py_XDECREF(all); Py_DECREF(m); return NULL; }
    return m;
}
