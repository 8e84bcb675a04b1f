/*
 * hostlib._p2pcore: the native core of the point-to-point layer under ring and tree.
 *
 * Layer: hostlib, under hostlib.native_p2p (the binding) and beside hostlib.p2p, ring.py
 * and tree.py (the Python engine, the executable specification). An Endpoint is one
 * worker's reliable channels to its peers, kept across the calls of a session (per-peer
 * sequence numbers, selective + cumulative acks, a send window, RFC 6298 timers, fast
 * retransmission, duplicate suppression, the next call's early messages); a Call is one
 * ring (allreduce, reduce_scatter, all_gather) or tree allreduce call of one rank on it.
 * Transition for transition they are P2pEndpoint and RingCall/TreeCall: the same
 * datagrams for the same events, bit-identical results (the additions in the same order,
 * in float32 or wrapping int32). Driven event by event from Python (the fake network's
 * differential test) or, for a whole call, by run() on the session's UDP socket with the
 * GIL released; serve_idle() answers peers between calls (the session's responder).
 *
 * Sends: run() hands the kernel consecutive datagrams to one peer as one UDP GSO send
 * (UDP_SEGMENT; hostlib.native.udp_gso, INALAB_UDP_GSO=0 turns it off). The kernel, or
 * a NIC's segmentation offload, cuts it back into the same datagrams in the same order
 * before they leave the host, so peers, switches and pcaps see what they saw without
 * it, while the sender's stack, qdisc and the eBPF switch's forwarder handle one buffer
 * per run instead of one per datagram (measured: a ring worker at 1 Gbit/s on star4
 * spent 28% of a core instead of 47%). Where the path cannot segment (no checksum
 * offload: the emulation's hosts in front of a Python or bmv2 switch; an MTU below the
 * datagram) the kernel refuses the send and the endpoint falls back to plain sends.
 *
 * Memory: packet buffers come from a pool of fixed-size buffers that grows by slabs and
 * is reused across calls; acknowledged packets return to it only after the outbox that
 * may still name them was sent. Nothing is allocated per packet once the pool has grown.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "_netcore.h"

#include <arpa/inet.h>
#include <errno.h>
#include <math.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#ifndef UDP_SEGMENT
#define UDP_SEGMENT 103 /* linux/udp.h: the send's segment size (UDP GSO) */
#endif
#define GSO_MAX_BYTES 65000 /* below IPv4's 65,507-byte UDP payload limit */
#define GSO_MAX_SEGS 64     /* the kernel's UDP_MAX_SEGMENTS */

#define P2P_VERSION 0xA
#define P2P_DATA ((P2P_VERSION << 4) | 1)
#define P2P_ACK ((P2P_VERSION << 4) | 2)
#define HSIZE 16
#define FLAG_RESEND 0x01
#define FLAG_DUPLICATE 0x02 /* ACK: the DATA had arrived before (D-SACK; statistics only) */
#define FLAG_EARLY 0x04     /* ACK: the DATA is of the receiver's next call (p2p.py) */
#define MAX_LANES 2048
#define SEQ_MAX 0xFFFFFFFFLL
#define PKT_MAX (HSIZE + 4 * MAX_LANES)
#define SLAB 64
#define BATCH 64
#define SIGNAL_CHECK_S 0.1

/* Receive batching (_netcore.h): while the call still expects at least two batches of
   messages, run() sleeps for about `batch` datagrams (a peer's DATA and the acks of
   this rank's DATA arrive interleaved) before it receives them together. The send
   windows (64 packets per peer by default, 4 ms at 1 Gbit/s) keep the links busy over
   a nap. Measured (star4 ring allreduce, 64 MiB int32, 1 Gbit/s, builds alternating):
   the ranks' CPU per Gbit 0.218-0.240 without, 0.188-0.193 with batches of 8, and
   0.874-0.881 s per call against 0.893-0.895 s. */
#define BATCH_DATAGRAMS 8

static PyObject *P2pErrorType;   /* hostlib.p2p.P2pError, set by the binding */
static PyObject *TimeoutType;    /* the binding's marker for the deadline */

/* ------------------------------------------------------------------ buffers */
typedef struct Buf {
    struct Buf *next;
    uint32_t len;
    uint32_t seq; /* queued DATA: its sequence number */
    uint8_t data[PKT_MAX];
} Buf;

typedef struct {
    Buf *free;
    void **slabs;
    Py_ssize_t nslabs, capslabs;
} Pool;

static Buf *pool_get(Pool *p) {
    if (!p->free) {
        if (p->nslabs == p->capslabs) {
            Py_ssize_t cap = p->capslabs ? 2 * p->capslabs : 16;
            void **s = realloc(p->slabs, (size_t)cap * sizeof(void *));
            if (!s) return NULL;
            p->slabs = s;
            p->capslabs = cap;
        }
        Buf *slab = malloc(SLAB * sizeof(Buf));
        if (!slab) return NULL;
        p->slabs[p->nslabs++] = slab;
        for (int k = 0; k < SLAB; k++) { slab[k].next = p->free; p->free = &slab[k]; }
    }
    Buf *b = p->free;
    p->free = b->next;
    b->next = NULL;
    return b;
}

static void pool_put(Pool *p, Buf *b) { b->next = p->free; p->free = b; }

static void pool_clear(Pool *p) {
    for (Py_ssize_t k = 0; k < p->nslabs; k++) free(p->slabs[k]);
    free(p->slabs);
    memset(p, 0, sizeof(*p));
}

/* --------------------------------------------------------------- growable rings */
#define RING(T, NAME)                                                                  \
    typedef struct { T *v; Py_ssize_t head, tail, cap; } NAME;                         \
    static int NAME##_push(NAME *r, T x) {                                             \
        if (r->tail - r->head == r->cap) {                                             \
            Py_ssize_t cap = r->cap ? 2 * r->cap : 16, n = r->tail - r->head;          \
            T *v = malloc((size_t)cap * sizeof(T));                                    \
            if (!v) return -1;                                                         \
            for (Py_ssize_t k = 0; k < n; k++) v[k] = r->v[(r->head + k) % r->cap];    \
            free(r->v); r->v = v; r->cap = cap; r->head = 0; r->tail = n;              \
        }                                                                              \
        r->v[r->tail++ % r->cap] = x;                                                  \
        return 0;                                                                      \
    }                                                                                  \
    static inline Py_ssize_t NAME##_len(const NAME *r) { return r->tail - r->head; }   \
    static inline T NAME##_front(const NAME *r) { return r->v[r->head % r->cap]; }     \
    static inline T NAME##_pop(NAME *r) { return r->v[r->head++ % r->cap]; }

typedef struct { int64_t tx; uint32_t seq; } TxSeq;
RING(TxSeq, OrderRing)
RING(Buf *, BufRing)

typedef struct {
    Buf *pkt;
    double sent_at, rto, deadline;
    int64_t tx;
    uint32_t seq;
    char resent;
    char rearmed;    /* the live timer was re-armed once for a stall */
    double stall_at; /* the endpoint's stall clock when the live timer was armed */
} Pending;

typedef struct {
    int64_t next_seq, cum, tx, high_tx;
    Pending *inflight; /* sorted by seq */
    Py_ssize_t ninfl, capinfl;
    BufRing queue;
    uint64_t *above; /* bit k: seq cum + 1 + k arrived */
    Py_ssize_t abovewords;
    OrderRing order;
    char entered; /* the peer answered a DATA of the current call from inside it */
} Channel;

typedef struct { double deadline; int32_t dst; uint32_t seq; } Timer;

typedef struct { int32_t src; uint32_t tag; Buf *payload; } Early;

struct Call;

typedef struct {
    PyObject_HEAD
    int rank, n, spec_lanes, spec_window, lanes, window;
    double min_timeout, max_timeout, backoff, deadline_s, late_timer;
    double heartbeat; /* RetryPolicy.heartbeat */
    StallClock clock;
    double rto, srtt, rttvar;
    double first_timeout; /* RetryPolicy.timeout: the least until a peer is in the call */
    int64_t samples;
    int64_t call;
    double last_progress, last_rx;
    Channel *ch;
    Timer *heap;
    Py_ssize_t nheap, capheap;
    /* the outbox: packets to send, in order (pool buffers) */
    const uint8_t **outp;
    uint32_t *outlen;
    int32_t *outdst;
    Py_ssize_t nout, capout;
    Buf **tofree; /* acked packets, freed after the outbox is sent */
    Py_ssize_t nfree, capfree;
    Early *stash;
    Py_ssize_t nstash, capstash;
    struct Call *handler;
    Pool pool;
    struct sockaddr_in *addrs;
    int gso; /* run(): consecutive datagrams to one peer as one UDP GSO send */
    int64_t sent, retransmitted, fast_retransmitted, duplicates, foreign, late_answered, spurious,
        late_timers;
    int64_t gso_sends; /* sendmmsg entries that carried more than one datagram */
    int batch;                        /* run(): datagrams a nap waits for (0: never) */
    int64_t naps, receives, received; /* run(): naps, recvmmsg calls, their datagrams */
} Endpoint;

enum { RING_AR = 0, RING_RS = 1, RING_AG = 2, TREE = 3 };

typedef struct Call {
    PyObject_HEAD
    Endpoint *ep; /* a strong reference */
    int kind, lanes, window, is_float, started, done;
    double linger;
    Py_buffer out; /* the result, written in place (the caller allocated it) */
    int have_out;
    /* A ring allreduce's input where it is not `out`: read there, and each element's
       first reduction writes src + received into out, so out needs no copy of the input
       first (a 64 MiB copy was 9 ms of a rank's CPU per call on this VM). */
    Py_buffer src;
    int have_src;
    int64_t size, remaining;
    char *error; /* a P2pError message, raised by the binding */
    /* ring */
    int first, nsteps, relabel, next, prev;
    int64_t *bounds, *seg_chunks, cps;
    /* tree */
    int parent, nchildren, children[2];
    int64_t nchunks;
    uint8_t *from_child; /* nchildren x size x 4 */
    int64_t *missing;
} Call;

/* ------------------------------------------------------------------ helpers */

static int grow(void **v, Py_ssize_t *cap, Py_ssize_t need, size_t item) {
    if (need <= *cap) return 0;
    Py_ssize_t c = *cap ? *cap : 16;
    while (c < need) c *= 2;
    void *n = realloc(*v, (size_t)c * item);
    if (!n) return -1;
    *v = n;
    *cap = c;
    return 0;
}

/* ------------------------------------------------------------- the endpoint */
static int timer_less(const Timer *a, const Timer *b) {
    if (a->deadline != b->deadline) return a->deadline < b->deadline;
    if (a->dst != b->dst) return a->dst < b->dst;
    return a->seq < b->seq;
}

static int heap_push(Endpoint *e, double deadline, int32_t dst, uint32_t seq) {
    if (grow((void **)&e->heap, &e->capheap, e->nheap + 1, sizeof(Timer)) < 0) return -1;
    Py_ssize_t i = e->nheap++;
    Timer t = {deadline, dst, seq};
    while (i > 0) {
        Py_ssize_t parent = (i - 1) / 2;
        if (!timer_less(&t, &e->heap[parent])) break;
        e->heap[i] = e->heap[parent];
        i = parent;
    }
    e->heap[i] = t;
    return 0;
}

static Timer heap_pop(Endpoint *e) {
    Timer top = e->heap[0];
    Timer last = e->heap[--e->nheap];
    Py_ssize_t i = 0, n = e->nheap;
    for (;;) {
        Py_ssize_t l = 2 * i + 1, r = l + 1, m = i;
        const Timer *best = &last;
        if (l < n && timer_less(&e->heap[l], best)) { m = l; best = &e->heap[l]; }
        if (r < n && timer_less(&e->heap[r], best)) m = r;
        if (m == i) break;
        e->heap[i] = e->heap[m];
        i = m;
    }
    if (n) e->heap[i] = last;
    return top;
}

static int out_push(Endpoint *e, const uint8_t *p, uint32_t len, int32_t dst) {
    if (grow((void **)&e->outp, &e->capout, e->nout + 1, sizeof(*e->outp)) < 0) return -1;
    Py_ssize_t cap = e->capout;
    /* outlen and outdst follow outp's capacity */
    uint32_t *l = realloc(e->outlen, (size_t)cap * sizeof(uint32_t));
    if (!l) return -1;
    e->outlen = l;
    int32_t *d = realloc(e->outdst, (size_t)cap * sizeof(int32_t));
    if (!d) return -1;
    e->outdst = d;
    e->outp[e->nout] = p;
    e->outlen[e->nout] = len;
    e->outdst[e->nout] = dst;
    e->nout++;
    return 0;
}

static int defer_free(Endpoint *e, Buf *b) {
    if (grow((void **)&e->tofree, &e->capfree, e->nfree + 1, sizeof(Buf *)) < 0) return -1;
    e->tofree[e->nfree++] = b;
    return 0;
}

/* An ack, in a pool buffer that returns to the pool once the outbox was sent. */
static int ack_push(Endpoint *e, int32_t src, uint32_t seq, uint32_t cum, unsigned call,
                    uint8_t flags) {
    Buf *b = pool_get(&e->pool);
    if (!b || defer_free(e, b) < 0) return -1;
    uint8_t *a = b->data;
    a[0] = P2P_ACK;
    a[1] = flags;
    a[2] = (uint8_t)e->rank;
    a[3] = (uint8_t)src;
    put32(a + 4, seq);
    put32(a + 8, cum);
    put16(a + 12, call);
    put16(a + 14, 0);
    b->len = HSIZE;
    return out_push(e, a, HSIZE, src);
}

/* A sample of a packet just taken out of flight: the gains divided by the packets that
   were in flight with it, on every channel, at most the samples so far (p2p.py's
   P2pEndpoint._flight). */
static void rtt_update(Endpoint *e, double rtt) {
    Rtt r = {e->rto, e->srtt, e->rttvar, e->samples};
    int64_t flight = 1;
    for (int i = 0; i < e->n; i++) flight += e->ch[i].ninfl;
    if (flight > e->samples) flight = e->samples > 1 ? e->samples : 1;
    rtt_sample(&r, rtt, e->min_timeout, e->max_timeout, flight);
    e->rto = r.rto;
    e->srtt = r.srtt;
    e->rttvar = r.rttvar;
    e->samples = r.samples;
}

static int transmit(Endpoint *e, int32_t dst, uint32_t seq, Buf *pkt, double now) {
    Channel *ch = &e->ch[dst];
    ch->tx++;
    if (grow((void **)&ch->inflight, &ch->capinfl, ch->ninfl + 1, sizeof(Pending)) < 0) return -1;
    /* Until the peer answers from inside this call, it may still be entering it. */
    double rto = ch->entered || e->rto >= e->first_timeout ? e->rto : e->first_timeout;
    ch->inflight[ch->ninfl++] =
        (Pending){pkt, now, rto, now + rto, ch->tx, seq, 0, 0, e->clock.stalled};
    if (OrderRing_push(&ch->order, (TxSeq){ch->tx, seq}) < 0) return -1;
    if (heap_push(e, now + rto, dst, seq) < 0) return -1;
    if (out_push(e, pkt->data, pkt->len, dst) < 0) return -1;
    e->sent++;
    return 0;
}

static int retransmit(Endpoint *e, int32_t dst, Pending *p, double now) {
    Channel *ch = &e->ch[dst];
    ch->tx++;
    p->tx = ch->tx;
    if (OrderRing_push(&ch->order, (TxSeq){ch->tx, p->seq}) < 0) return -1;
    p->deadline = now + p->rto;
    p->resent = 1;
    p->rearmed = 0;
    p->stall_at = e->clock.stalled;
    p->pkt->data[1] |= FLAG_RESEND;
    if (heap_push(e, p->deadline, dst, p->seq) < 0) return -1;
    if (out_push(e, p->pkt->data, p->pkt->len, dst) < 0) return -1;
    e->sent++;
    e->retransmitted++;
    return 0;
}

static Pending *find(Channel *ch, uint32_t seq, Py_ssize_t *at) {
    /* inflight is sorted by seq: binary search */
    Py_ssize_t lo = 0, hi = ch->ninfl;
    while (lo < hi) {
        Py_ssize_t mid = (lo + hi) / 2;
        if (ch->inflight[mid].seq < seq) lo = mid + 1; else hi = mid;
    }
    if (lo < ch->ninfl && ch->inflight[lo].seq == seq) { *at = lo; return &ch->inflight[lo]; }
    return NULL;
}

/* answers_original: the ack named this packet and echoed no FLAG_RESEND */
static int acked(Endpoint *e, Channel *ch, Py_ssize_t at, double now, int answers_original) {
    Pending p = ch->inflight[at];
    memmove(ch->inflight + at, ch->inflight + at + 1, (size_t)(ch->ninfl - at - 1) * sizeof(Pending));
    ch->ninfl--;
    e->last_progress = now;
    if (!p.resent) { /* Karn's rule: a retransmitted packet's ack is ambiguous ... */
        rtt_update(e, now - p.sent_at);
        if (p.tx > ch->high_tx) ch->high_tx = p.tx;
    } else if (answers_original) { /* ... unless it answers the original: spurious */
        rtt_update(e, now - p.sent_at);
        e->spurious++;
    }
    return defer_free(e, p.pkt);
}

static int detect_losses(Endpoint *e, int32_t dst, Channel *ch, double now) {
    int64_t threshold = ch->high_tx - reorder_threshold(e->window);
    while (OrderRing_len(&ch->order) && OrderRing_front(&ch->order).tx <= threshold) {
        TxSeq o = OrderRing_pop(&ch->order);
        Py_ssize_t at;
        Pending *p = find(ch, o.seq, &at);
        if (p && p->tx == o.tx) {
            if (retransmit(e, dst, p, now) < 0) return -1;
            e->fast_retransmitted++;
        }
    }
    return 0;
}

/* flags: the ACK's; FLAG_RESEND there echoes the DATA's (p2p.py, "Spurious timeouts") */
static int on_ack(Endpoint *e, int32_t src, uint32_t seq, uint32_t cum, unsigned call,
                  uint8_t flags, double now) {
    Channel *ch = &e->ch[src];
    if (call == (unsigned)(e->call & 0xFFFF) && !(flags & FLAG_EARLY)) ch->entered = 1;
    Py_ssize_t at;
    if (find(ch, seq, &at) && acked(e, ch, at, now, !(flags & FLAG_RESEND)) < 0) return -1;
    while (ch->ninfl && ch->inflight[0].seq <= cum)
        if (acked(e, ch, 0, now, 0) < 0) return -1;
    if (detect_losses(e, src, ch, now) < 0) return -1;
    while (BufRing_len(&ch->queue) && ch->ninfl < e->window) {
        Buf *b = BufRing_pop(&ch->queue);
        if (transmit(e, src, b->seq, b, now) < 0) return -1;
    }
    return 0;
}

/* The received-above-cum set: a circular bitmap over (cum, cum + 64 * words]. */
static int above_has(const Channel *ch, int64_t seq) {
    int64_t k = seq - ch->cum - 1;
    if (k < 0 || k >= 64 * (int64_t)ch->abovewords) return 0;
    uint64_t bit = (uint64_t)seq % (64 * (uint64_t)ch->abovewords);
    return (ch->above[bit / 64] >> (bit % 64)) & 1;
}

static void above_set(Channel *ch, int64_t seq, int on) {
    uint64_t bit = (uint64_t)seq % (64 * (uint64_t)ch->abovewords);
    if (on) ch->above[bit / 64] |= (uint64_t)1 << (bit % 64);
    else ch->above[bit / 64] &= ~((uint64_t)1 << (bit % 64));
}

static int above_add(Channel *ch, int64_t seq) {
    while (seq - ch->cum > 64 * (int64_t)ch->abovewords) { /* grow, keeping the members */
        Py_ssize_t words = ch->abovewords ? 2 * ch->abovewords : 4;
        uint64_t *bits = calloc((size_t)words, 8);
        if (!bits) return -1;
        Channel bigger = *ch;
        bigger.above = bits;
        bigger.abovewords = words;
        for (int64_t s = ch->cum + 1; ch->abovewords && s <= ch->cum + 64 * (int64_t)ch->abovewords; s++)
            if (above_has(ch, s)) above_set(&bigger, s, 1);
        free(ch->above);
        ch->above = bits;
        ch->abovewords = words;
    }
    above_set(ch, seq, 1);
    return 0;
}

static int call_on_message(Call *c, int32_t src, uint32_t tag, const uint8_t *payload,
                           Py_ssize_t len, double now);

/* A DATA packet. Returns 0, -1 on no memory, -2 when the call set its error. */
static int on_data(Endpoint *e, int32_t src, uint32_t seq, uint32_t tag, unsigned call,
                   uint8_t data_flags, const uint8_t *payload, Py_ssize_t len, double now) {
    Channel *ch = &e->ch[src];
    uint8_t flags = data_flags & FLAG_RESEND; /* echoed: which copy this ack answers */
    unsigned ahead = (call - (unsigned)(e->call & 0xFFFF)) & 0xFFFF;
    if (ahead == 1) flags |= FLAG_EARLY; /* kept for a call this endpoint has not started */
    if (seq <= ch->cum || above_has(ch, seq)) {
        e->duplicates++; /* our ack was lost or late: acknowledge again */
        flags |= FLAG_DUPLICATE;
    } else {
        if (ahead == 0 && e->handler) {
            int r = call_on_message(e->handler, src, tag, payload, len, now);
            if (r) return r;
        } else if (ahead == 1) {
            if (grow((void **)&e->stash, &e->capstash, e->nstash + 1, sizeof(Early)) < 0) return -1;
            Buf *b = pool_get(&e->pool);
            if (!b) return -1;
            memcpy(b->data, payload, (size_t)len);
            b->len = (uint32_t)len;
            e->stash[e->nstash++] = (Early){src, tag, b};
        } else { /* cannot happen between correct peers: do not acknowledge it */
            e->foreign++;
            return 0;
        }
        e->last_progress = now;
        if ((int64_t)seq == ch->cum + 1) {
            ch->cum = seq;
            while (above_has(ch, ch->cum + 1)) {
                above_set(ch, ch->cum + 1, 0);
                ch->cum++;
            }
        } else if (above_add(ch, seq) < 0) {
            return -1;
        }
    }
    return ack_push(e, src, seq, (uint32_t)ch->cum, call, flags) < 0 ? -1 : 0;
}

/* hostlib.p2p.P2pEndpoint.next_timer: the earliest timer, or the stall clock's heartbeat
   while any timer runs. */
static double ep_next_timer(const Endpoint *e) {
    if (!e->nheap) return INFINITY;
    double beat = e->clock.seen + e->heartbeat;
    return beat < e->heap[0].deadline ? beat : e->heap[0].deadline;
}

/* Every call into the endpoint first observes the stall clock (hostlib.ina.StallClock). */
static void ep_observe(Endpoint *e, double now) {
    stall_observe(&e->clock, now, ep_next_timer(e));
}

static int ep_on_datagram(Endpoint *e, const uint8_t *d, Py_ssize_t len, double now) {
    ep_observe(e, now);
    if (len < HSIZE) { e->foreign++; return 0; }
    int vt = d[0], src = d[2], dst = d[3];
    uint32_t seq = get32(d + 4), aux = get32(d + 8);
    unsigned call = get16(d + 12), count = get16(d + 14);
    if (dst != e->rank || src >= e->n || src == dst) { e->foreign++; return 0; }
    if (vt == P2P_ACK) {
        e->last_rx = now;
        return on_ack(e, src, seq, aux, call, d[1], now);
    }
    if (vt == P2P_DATA && len == HSIZE + 4 * (Py_ssize_t)count) {
        e->last_rx = now;
        return on_data(e, src, seq, aux, call, d[1], d + HSIZE, len - HSIZE, now);
    }
    e->foreign++;
    return 0;
}

static int ep_on_timer(Endpoint *e, double now) {
    ep_observe(e, now);
    int backed_off = 0;
    while (e->nheap && e->heap[0].deadline <= now) {
        Timer t = heap_pop(e);
        Py_ssize_t at;
        Pending *p = find(&e->ch[t.dst], t.seq, &at);
        if (!p || p->deadline != t.deadline) continue; /* acknowledged, or re-armed since */
        double stalled = e->clock.stalled - p->stall_at;
        if (!p->rearmed && stalled > e->late_timer * p->rto) {
            /* Stalled through (hostlib.ina.RetryPolicy.stalled_through): one timeout more
               from now. */
            p->rearmed = 1;
            p->deadline = now + p->rto;
            if (heap_push(e, p->deadline, t.dst, p->seq) < 0) return -1;
            e->late_timers++;
            continue;
        }
        if (!backed_off) { /* RFC 6298 5.5, once per expiry */
            double rto = e->rto * e->backoff;
            e->rto = rto < e->max_timeout ? rto : e->max_timeout;
            backed_off = 1;
        }
        double rto = p->rto * e->backoff;
        p->rto = rto < e->max_timeout ? rto : e->max_timeout;
        if (retransmit(e, t.dst, p, now) < 0) return -1;
    }
    return 0;
}

static int ep_unacked(const Endpoint *e) {
    for (int r = 0; r < e->n; r++)
        if (e->ch[r].ninfl || BufRing_len(&e->ch[r].queue)) return 1;
    return 0;
}

/* Queue one message for dst (elements already little-endian 4-byte values). */
static int ep_send(Endpoint *e, int32_t dst, uint32_t tag, const uint8_t *payload, int64_t count,
                   double now, char **error) {
    Channel *ch = &e->ch[dst];
    if (ch->next_seq > SEQ_MAX) {
        char msg[128];
        snprintf(msg, sizeof msg, "channel to rank %d ran out of sequence numbers", dst);
        *error = strdup(msg);
        return -2;
    }
    uint32_t seq = (uint32_t)ch->next_seq++;
    Buf *b = pool_get(&e->pool);
    if (!b) return -1;
    uint8_t *p = b->data;
    p[0] = P2P_DATA;
    p[1] = 0;
    p[2] = (uint8_t)e->rank;
    p[3] = (uint8_t)dst;
    put32(p + 4, seq);
    put32(p + 8, tag);
    put16(p + 12, (unsigned)(e->call & 0xFFFF));
    put16(p + 14, (unsigned)count);
    memcpy(p + HSIZE, payload, (size_t)count * 4);
    b->len = (uint32_t)(HSIZE + 4 * count);
    b->seq = seq;
    if (ch->ninfl < e->window) return transmit(e, dst, seq, b, now);
    return BufRing_push(&ch->queue, b);
}

/* After the outbox was sent (or copied out): forget it, recycle acked packets. */
static void ep_outbox_sent(Endpoint *e) {
    e->nout = 0;
    for (Py_ssize_t k = 0; k < e->nfree; k++) pool_put(&e->pool, e->tofree[k]);
    e->nfree = 0;
}


/* ------------------------------------------------------------------ the call */
#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the p2p wire payload is little-endian: this core copies it as is"
#endif

static int fail(Call *c, const char *fmt, long long a, long long b) {
    char msg[256];
    snprintf(msg, sizeof msg, fmt, c->ep->rank, (long long)c->ep->call, a, b);
    free(c->error);
    c->error = strdup(msg);
    return -2;
}

static int bad_tag(Call *c, int32_t src, uint32_t tag) {
    return fail(c, "rank %d call %lld: unexpected message %lld from rank %lld (do all ranks call "
                   "with the same sizes and algorithm?)", (long long)tag, (long long)src);
}

/* _received: the payload's length checked against out[lo:hi]. */
static int received(Call *c, Py_ssize_t len, int64_t lo, int64_t hi) {
    if (len != 4 * (hi - lo))
        return fail(c, "rank %d call %lld: a message of %lld elements where %lld were expected "
                       "(do all ranks call with the same sizes?)", (long long)(len / 4),
                    (long long)(hi - lo));
    c->remaining--;
    return 0;
}

/* mine = from + other, element by element; from may be mine (an add in place). */
static void add_into(Call *c, uint8_t *mine, const uint8_t *from, const uint8_t *other,
                     int64_t count) {
    if (c->is_float) {
        float *m = (float *)mine;
        const float *f = (const float *)from, *o = (const float *)other;
        for (int64_t i = 0; i < count; i++) m[i] = f[i] + o[i];
    } else {
        uint32_t *m = (uint32_t *)mine;
        const uint32_t *f = (const uint32_t *)from, *o = (const uint32_t *)other;
        for (int64_t i = 0; i < count; i++) m[i] = f[i] + o[i]; /* int32 wraps */
    }
}

static inline uint8_t *out_at(Call *c, int64_t i) { return (uint8_t *)c->out.buf + 4 * i; }
/* Where this rank's own input of element i is: src, or out before it is reduced. */
static inline const uint8_t *in_at(Call *c, int64_t i) {
    return c->have_src ? (const uint8_t *)c->src.buf + 4 * i : out_at(c, i);
}

static int send_slice(Call *c, int32_t dst, uint32_t tag, int64_t lo, int64_t hi, double now) {
    return ep_send(c->ep, dst, tag, out_at(c, lo), hi - lo, now, &c->error);
}

static inline int64_t pymod(int64_t a, int64_t n) { int64_t m = a % n; return m < 0 ? m + n : m; }

static int64_t ring_segment(Call *c, int64_t step) {
    return pymod(c->ep->rank - c->first - step - c->relabel, c->ep->n);
}

static void ring_chunk(Call *c, int64_t segment, int64_t chunk, int64_t *lo, int64_t *hi) {
    *lo = c->bounds[segment] + chunk * c->lanes;
    *hi = *lo + c->lanes < c->bounds[segment + 1] ? *lo + c->lanes : c->bounds[segment + 1];
}

static int ring_begin(Call *c, double now) {
    if (c->nsteps == 0) return 0;
    int64_t own = ring_segment(c, 0);
    for (int64_t k = 0; k < c->seg_chunks[own]; k++) {
        int64_t lo, hi;
        ring_chunk(c, own, k, &lo, &hi);
        int r = ep_send(c->ep, c->next, (uint32_t)k, in_at(c, lo), hi - lo, now, &c->error);
        if (r) return r;
    }
    return 0;
}

static int ring_on_message(Call *c, int32_t src, uint32_t tag, const uint8_t *payload,
                           Py_ssize_t len, double now) {
    int64_t step = tag / c->cps, k = tag % c->cps;
    if (src != c->prev || step >= c->nsteps) return bad_tag(c, src, tag);
    int64_t segment = ring_segment(c, step + 1);
    if (k >= c->seg_chunks[segment]) return bad_tag(c, src, tag);
    int64_t lo, hi;
    ring_chunk(c, segment, k, &lo, &hi);
    int r = received(c, len, lo, hi);
    if (r) return r;
    if (c->first + step >= c->ep->n - 1) memcpy(out_at(c, lo), payload, (size_t)(hi - lo) * 4);
    else add_into(c, out_at(c, lo), in_at(c, lo), payload, hi - lo);
    if (step + 1 < c->nsteps) return send_slice(c, c->next, (uint32_t)(tag + c->cps), lo, hi, now);
    return 0;
}

static void tree_chunk(Call *c, int64_t k, int64_t *lo, int64_t *hi) {
    *lo = k * c->lanes;
    *hi = *lo + c->lanes < c->size ? *lo + c->lanes : c->size;
}

static int tree_broadcast(Call *c, int64_t k, double now) {
    int64_t lo, hi;
    tree_chunk(c, k, &lo, &hi);
    for (int i = 0; i < c->nchildren; i++) {
        int r = send_slice(c, c->children[i], (uint32_t)(c->nchunks + k), lo, hi, now);
        if (r) return r;
    }
    return 0;
}

static int tree_reduced(Call *c, int64_t k, double now) {
    if (c->parent >= 0) {
        int64_t lo, hi;
        tree_chunk(c, k, &lo, &hi);
        return send_slice(c, c->parent, (uint32_t)k, lo, hi, now);
    }
    return tree_broadcast(c, k, now);
}

static int tree_begin(Call *c, double now) {
    if (c->nchildren) return 0;
    for (int64_t k = 0; k < c->nchunks; k++) {
        int r = tree_reduced(c, k, now);
        if (r) return r;
    }
    return 0;
}

static int tree_on_message(Call *c, int32_t src, uint32_t tag, const uint8_t *payload,
                           Py_ssize_t len, double now) {
    int index = -1;
    for (int i = 0; i < c->nchildren; i++)
        if (c->children[i] == src) index = i;
    if (index >= 0 && tag < c->nchunks) {
        int64_t lo, hi;
        tree_chunk(c, tag, &lo, &hi);
        int r = received(c, len, lo, hi);
        if (r) return r;
        memcpy(c->from_child + ((size_t)index * c->size + lo) * 4, payload, (size_t)(hi - lo) * 4);
        if (--c->missing[tag] == 0) {
            for (int i = 0; i < c->nchildren; i++)
                add_into(c, out_at(c, lo), out_at(c, lo),
                         c->from_child + ((size_t)i * c->size + lo) * 4, hi - lo);
            return tree_reduced(c, tag, now);
        }
        return 0;
    }
    if (src == c->parent && tag >= c->nchunks && tag < 2 * c->nchunks) {
        int64_t k = tag - c->nchunks, lo, hi;
        tree_chunk(c, k, &lo, &hi);
        int r = received(c, len, lo, hi);
        if (r) return r;
        memcpy(out_at(c, lo), payload, (size_t)(hi - lo) * 4);
        return tree_broadcast(c, k, now);
    }
    return bad_tag(c, src, tag);
}

static int call_on_message(Call *c, int32_t src, uint32_t tag, const uint8_t *payload,
                           Py_ssize_t len, double now) {
    return c->kind == TREE ? tree_on_message(c, src, tag, payload, len, now)
                           : ring_on_message(c, src, tag, payload, len, now);
}

static void call_check(Call *c, double now) {
    Endpoint *e = c->ep;
    if (c->done || c->remaining || ep_unacked(e)) return;
    if (now >= e->last_rx + c->linger) {
        c->done = 1;
        e->handler = NULL;
    }
}

static double call_next_wakeup(Call *c) {
    Endpoint *e = c->ep;
    if (e->nout) return -INFINITY;
    double wake = ep_next_timer(e), dl = e->last_progress + e->deadline_s;
    if (dl < wake) wake = dl;
    if (c->remaining == 0 && !ep_unacked(e) && e->last_rx + c->linger < wake)
        wake = e->last_rx + c->linger;
    return wake;
}

/* 0, -1 no memory, -2 the call's error, -3 the deadline passed */
static int call_timer(Call *c, double now) {
    Endpoint *e = c->ep;
    if (ep_on_timer(e, now) < 0) return -1;
    call_check(c, now);
    int waiting = !c->done && (c->remaining || ep_unacked(e));
    if (waiting && now >= e->last_progress + e->deadline_s) return -3;
    return 0;
}

static int call_start(Call *c, double now) {
    Endpoint *e = c->ep;
    e->lanes = c->lanes;
    e->window = c->window;
    e->call++;
    e->handler = c;
    e->last_progress = now;
    e->clock.seen = now; /* the time between calls is no stall */
    for (int r = 0; r < e->n; r++) e->ch[r].entered = 0;
    c->started = 1;
    Py_ssize_t nearly = e->nstash;
    int r = c->kind == TREE ? tree_begin(c, now) : ring_begin(c, now);
    for (Py_ssize_t k = 0; !r && k < nearly; k++) {
        Early x = e->stash[k];
        r = call_on_message(c, x.src, x.tag, x.payload->data, x.payload->len, now);
    }
    for (Py_ssize_t k = 0; k < nearly; k++)
        if (defer_free(e, e->stash[k].payload) < 0 && !r) r = -1;
    /* messages of this call that arrived while its early ones were handled stay */
    memmove(e->stash, e->stash + nearly, (size_t)(e->nstash - nearly) * sizeof(Early));
    e->nstash -= nearly;
    if (r) return r;
    call_check(c, now);
    return 0;
}

/* ----------------------------------------------------------- Python: Endpoint */
static void Endpoint_dealloc(Endpoint *e) {
    if (e->ch) {
        for (int r = 0; r < e->n; r++) {
            free(e->ch[r].inflight);
            free(e->ch[r].queue.v);
            free(e->ch[r].order.v);
            free(e->ch[r].above);
        }
    }
    free(e->ch); free(e->heap); free(e->outp); free(e->outlen); free(e->outdst);
    free(e->tofree); free(e->stash); free(e->addrs);
    pool_clear(&e->pool);
    Py_TYPE(e)->tp_free((PyObject *)e);
}

static int Endpoint_init(Endpoint *e, PyObject *args, PyObject *kw) {
    static char *names[] = {"rank", "addrs", "lanes", "window", "timeout", "min_timeout",
                            "max_timeout", "backoff", "deadline", "gso", "late_timer",
                            "stall_check", NULL};
    PyObject *addrs;
    double stall_check = 0.0025;
    e->gso = 0;
    e->late_timer = INFINITY;
    e->batch = BATCH_DATAGRAMS;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "iOiiddddd|pdd", names, &e->rank, &addrs,
                                     &e->spec_lanes, &e->spec_window, &e->rto, &e->min_timeout,
                                     &e->max_timeout, &e->backoff, &e->deadline_s, &e->gso,
                                     &e->late_timer, &stall_check))
        return -1;
    if (e->ch) {
        PyErr_SetString(PyExc_RuntimeError, "Endpoint is initialised once");
        return -1;
    }
    Py_ssize_t n = PySequence_Size(addrs);
    if (n < 1 || n > 256 || e->rank < 0 || e->rank >= n) {
        PyErr_SetString(PyExc_ValueError, "1..256 addresses and a rank among them");
        return -1;
    }
    e->n = (int)n;
    e->ch = calloc((size_t)n, sizeof(Channel));
    e->addrs = calloc((size_t)n, sizeof(struct sockaddr_in));
    if (!e->ch || !e->addrs) { PyErr_NoMemory(); return -1; }
    for (Py_ssize_t r = 0; r < n; r++) {
        PyObject *item = PySequence_GetItem(addrs, r);
        const char *ip;
        int port;
        if (!item || !PyArg_ParseTuple(item, "si", &ip, &port)) { Py_XDECREF(item); return -1; }
        e->addrs[r].sin_family = AF_INET;
        e->addrs[r].sin_port = htons((uint16_t)port);
        int ok = inet_pton(AF_INET, ip, &e->addrs[r].sin_addr);
        Py_DECREF(item);
        if (ok != 1) { PyErr_Format(PyExc_ValueError, "not an IPv4 address: %s", ip); return -1; }
        e->ch[r].next_seq = 1;
    }
    e->lanes = e->spec_lanes;
    e->window = e->spec_window;
    e->first_timeout = e->rto; /* the initial timeout */
    e->last_rx = -INFINITY;
    stall_init(&e->clock, e->late_timer, e->min_timeout);
    e->heartbeat = stall_heartbeat(e->late_timer, stall_check);
    return 0;
}

static PyObject *outbox_list(Endpoint *e) {
    PyObject *list = PyList_New(e->nout);
    if (!list) return NULL;
    for (Py_ssize_t k = 0; k < e->nout; k++) {
        PyObject *b = PyBytes_FromStringAndSize((const char *)e->outp[k], e->outlen[k]);
        if (!b) { Py_DECREF(list); return NULL; }
        PyList_SET_ITEM(list, k, b);
    }
    ep_outbox_sent(e);
    return list;
}

static PyObject *Endpoint_take_outbox(Endpoint *e, PyObject *Py_UNUSED(x)) { return outbox_list(e); }

static PyObject *Endpoint_on_datagram(Endpoint *e, PyObject *args) {
    Py_buffer d;
    double now;
    if (!PyArg_ParseTuple(args, "y*d", &d, &now)) return NULL;
    int r = ep_on_datagram(e, d.buf, d.len, now);
    PyBuffer_Release(&d);
    if (r == -1) return PyErr_NoMemory();
    Py_RETURN_NONE;
}

static PyObject *Endpoint_on_timer(Endpoint *e, PyObject *arg) {
    double now = PyFloat_AsDouble(arg);
    if (now == -1.0 && PyErr_Occurred()) return NULL;
    if (ep_on_timer(e, now) < 0) return PyErr_NoMemory();
    Py_RETURN_NONE;
}

static PyObject *Endpoint_waiting_for(Endpoint *e, PyObject *Py_UNUSED(x)) {
    PyObject *d = PyDict_New();
    for (int r = 0; d && r < e->n; r++) {
        Py_ssize_t k = e->ch[r].ninfl + BufRing_len(&e->ch[r].queue);
        if (!k) continue;
        PyObject *key = PyLong_FromLong(r), *v = PyLong_FromSsize_t(k);
        if (!key || !v || PyDict_SetItem(d, key, v) < 0) { Py_XDECREF(key); Py_XDECREF(v); Py_DECREF(d); return NULL; }
        Py_DECREF(key);
        Py_DECREF(v);
    }
    return d;
}

static int from_rank(Endpoint *e, const struct sockaddr_in *a) {
    for (int r = 0; r < e->n; r++)
        if (e->addrs[r].sin_port == a->sin_port && e->addrs[r].sin_addr.s_addr == a->sin_addr.s_addr)
            return r;
    return -1;
}

static int flush_outbox(Endpoint *e, int fd);

/* The session's responder: every datagram waiting on fd, answered as between calls. */
static int serve_idle(Endpoint *e, int fd, double now) {
    uint8_t *buf = malloc(PKT_MAX + 64);
    if (!buf) return ENOMEM;
    int err = 0;
    for (;;) {
        struct sockaddr_in src;
        socklen_t sl = sizeof src;
        ssize_t n = recvfrom(fd, buf, PKT_MAX + 64, MSG_DONTWAIT, (struct sockaddr *)&src, &sl);
        if (n < 0) {
            if (errno == ECONNREFUSED || errno == EINTR) continue;
            if (errno != EAGAIN) err = errno;
            break;
        }
        if (n && from_rank(e, &src) >= 0) {
            if (ep_on_datagram(e, buf, n, now) == -1) { err = ENOMEM; break; }
            e->late_answered++;
        } else if (n) {
            e->foreign++;
        }
    }
    free(buf);
    if (!err && ep_on_timer(e, now) < 0) err = ENOMEM;
    if (!err) err = flush_outbox(e, fd);
    return err;
}

static PyObject *Endpoint_serve_idle(Endpoint *e, PyObject *args) {
    int fd;
    double now;
    if (!PyArg_ParseTuple(args, "id", &fd, &now)) return NULL;
    int err;
    Py_BEGIN_ALLOW_THREADS
    err = serve_idle(e, fd, now);
    Py_END_ALLOW_THREADS
    if (err == ENOMEM) return PyErr_NoMemory();
    if (err) { errno = err; return PyErr_SetFromErrno(PyExc_OSError); }
    Py_RETURN_NONE;
}

static PyObject *Endpoint_get_state(Endpoint *e, void *Py_UNUSED(x)) {
    return Py_BuildValue(
        "{s:L,s:d,s:d,s:d,s:d,s:d,s:L,s:O,s:O,s:L,s:L,s:L,s:L,s:L,s:L,s:i,s:i,s:O,s:L,s:L,s:L,"
        "s:i,s:L,s:L,s:L}",
        "call",
        (long long)e->call, "last_progress", e->last_progress, "last_rx", e->last_rx, "rto",
        e->rto, "srtt", e->srtt, "rttvar", e->rttvar, "samples", (long long)e->samples,
        "unacked", ep_unacked(e) ? Py_True : Py_False, "has_output",
        e->nout ? Py_True : Py_False, "sent", (long long)e->sent, "retransmitted",
        (long long)e->retransmitted, "fast_retransmitted", (long long)e->fast_retransmitted,
        "duplicates", (long long)e->duplicates, "foreign", (long long)e->foreign,
        "late_answered", (long long)e->late_answered, "lanes", e->lanes, "window", e->window,
        "gso", e->gso ? Py_True : Py_False, "gso_sends", (long long)e->gso_sends, "spurious",
        (long long)e->spurious, "late_timers", (long long)e->late_timers, "batch_datagrams",
        e->batch, "naps", (long long)e->naps, "receives", (long long)e->receives, "received",
        (long long)e->received);
}

static PyObject *Endpoint_next_timer(Endpoint *e, PyObject *Py_UNUSED(x)) {
    return PyFloat_FromDouble(ep_next_timer(e));
}

static PyMethodDef Endpoint_methods[] = {
    {"take_outbox", (PyCFunction)Endpoint_take_outbox, METH_NOARGS, "packets to send"},
    {"on_datagram", (PyCFunction)Endpoint_on_datagram, METH_VARARGS, "take one datagram"},
    {"on_timer", (PyCFunction)Endpoint_on_timer, METH_O, "retransmit what expired"},
    {"next_timer", (PyCFunction)Endpoint_next_timer, METH_NOARGS, "the next timer"},
    {"waiting_for", (PyCFunction)Endpoint_waiting_for, METH_NOARGS, "unacked per peer"},
    {"serve_idle", (PyCFunction)Endpoint_serve_idle, METH_VARARGS,
     "serve_idle(fd, now): answer every waiting datagram as between calls"},
    {NULL, NULL, 0, NULL},
};

static PyObject *Endpoint_get_batch(Endpoint *e, void *Py_UNUSED(x)) {
    return PyLong_FromLong(e->batch);
}

static int Endpoint_set_batch(Endpoint *e, PyObject *value, void *Py_UNUSED(x)) {
    long v = value ? PyLong_AsLong(value) : -1;
    if (v == -1 && PyErr_Occurred()) return -1;
    if (v < 0 || v > INT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "batch_datagrams must be 0 or more");
        return -1;
    }
    e->batch = (int)v;
    return 0;
}

static PyGetSetDef Endpoint_getset[] = {
    {"state", (getter)Endpoint_get_state, NULL, "counters, times, RTT", NULL},
    {"batch_datagrams", (getter)Endpoint_get_batch, (setter)Endpoint_set_batch,
     "datagrams run() naps for before a receive (0: never)", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject EndpointType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "hostlib._p2pcore.Endpoint",
    .tp_basicsize = sizeof(Endpoint),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "One worker's reliable channels to its peers (hostlib.p2p.P2pEndpoint).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Endpoint_init,
    .tp_dealloc = (destructor)Endpoint_dealloc,
    .tp_methods = Endpoint_methods,
    .tp_getset = Endpoint_getset,
};

/* ------------------------------------------------------------- Python: Call */
static void Call_dealloc(Call *c) {
    if (c->ep && c->ep->handler == c) c->ep->handler = NULL;
    Py_XDECREF((PyObject *)c->ep);
    if (c->have_out) PyBuffer_Release(&c->out);
    if (c->have_src) PyBuffer_Release(&c->src);
    free(c->bounds); free(c->seg_chunks); free(c->from_child); free(c->missing); free(c->error);
    Py_TYPE(c)->tp_free((PyObject *)c);
}

static int ring_prepare(Call *c) {
    int n = c->ep->n, r = c->ep->rank;
    c->next = (r + 1) % n;
    c->prev = (int)pymod(r - 1, n);
    c->first = c->kind == RING_AG ? n - 1 : 0;
    c->nsteps = c->kind == RING_AR ? 2 * (n - 1) : n - 1;
    c->relabel = c->kind == RING_AR ? 0 : 1;
    c->bounds = malloc((size_t)(n + 1) * sizeof(int64_t));
    c->seg_chunks = malloc((size_t)n * sizeof(int64_t));
    if (!c->bounds || !c->seg_chunks) { PyErr_NoMemory(); return -1; }
    for (int g = 0; g <= n; g++) c->bounds[g] = (int64_t)g * c->size / n;
    int64_t cps = 1;
    for (int g = 0; g < n; g++) {
        int64_t len = c->bounds[g + 1] - c->bounds[g];
        c->seg_chunks[g] = (len + c->lanes - 1) / c->lanes;
        if (c->seg_chunks[g] > cps) cps = c->seg_chunks[g];
    }
    c->cps = cps;
    if ((int64_t)c->nsteps * cps > ((int64_t)1 << 32)) {
        PyErr_Format(PyExc_ValueError, "%lld elements need more than 2**32 messages",
                     (long long)c->size);
        return -1;
    }
    c->remaining = 0;
    for (int64_t s = 0; s < c->nsteps; s++) c->remaining += c->seg_chunks[ring_segment(c, s + 1)];
    return 0;
}

static int tree_prepare(Call *c) {
    int n = c->ep->n, r = c->ep->rank;
    c->nchunks = (c->size + c->lanes - 1) / c->lanes;
    if (2 * c->nchunks > ((int64_t)1 << 32)) {
        PyErr_Format(PyExc_ValueError, "%lld elements need more than 2**32 messages",
                     (long long)c->size);
        return -1;
    }
    c->parent = r ? (r - 1) / 2 : -1;
    c->nchildren = 0;
    for (int k = 2 * r + 1; k <= 2 * r + 2; k++)
        if (k < n) c->children[c->nchildren++] = k;
    c->from_child = calloc((size_t)(c->nchildren ? c->nchildren : 1) * (size_t)(c->size ? c->size : 1), 4);
    c->missing = malloc((size_t)(c->nchunks ? c->nchunks : 1) * sizeof(int64_t));
    if (!c->from_child || !c->missing) { PyErr_NoMemory(); return -1; }
    for (int64_t k = 0; k < c->nchunks; k++) c->missing[k] = c->nchildren;
    c->remaining = c->nchunks * (c->nchildren + (c->parent >= 0));
    return 0;
}

static int Call_init(Call *c, PyObject *args, PyObject *kw) {
    static char *names[] = {"endpoint", "kind", "out", "is_float", "lanes", "window", "linger",
                            "src", NULL};
    PyObject *ep, *out, *src = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O!iOpiid|O", names, &EndpointType, &ep, &c->kind,
                                     &out, &c->is_float, &c->lanes, &c->window, &c->linger, &src))
        return -1;
    if (c->ep) {
        PyErr_SetString(PyExc_RuntimeError, "Call is initialised once");
        return -1;
    }
    if (c->kind < RING_AR || c->kind > TREE || c->lanes < 1 || c->lanes > MAX_LANES || c->window < 1) {
        PyErr_SetString(PyExc_ValueError, "kind, lanes or window out of range");
        return -1;
    }
    c->ep = (Endpoint *)Py_NewRef(ep);
    if (PyObject_GetBuffer(out, &c->out, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0) return -1;
    c->have_out = 1;
    if (c->out.len % 4) {
        PyErr_SetString(PyExc_ValueError, "out must hold 4-byte elements");
        return -1;
    }
    c->size = c->out.len / 4;
    if (src != Py_None) {
        if (c->kind != RING_AR) {
            PyErr_SetString(PyExc_ValueError, "src is for ring allreduce calls only");
            return -1;
        }
        if (PyObject_GetBuffer(src, &c->src, PyBUF_C_CONTIGUOUS) < 0) return -1;
        c->have_src = 1;
        if (c->src.len != c->out.len) {
            PyErr_SetString(PyExc_ValueError, "src and out differ in size");
            return -1;
        }
    }
    return c->kind == TREE ? tree_prepare(c) : ring_prepare(c);
}

static PyObject *call_error(Call *c, int r) {
    if (r == -1) return PyErr_NoMemory();
    PyErr_SetString(P2pErrorType, c->error ? c->error : "p2p call failed");
    return NULL;
}

static PyObject *Call_start(Call *c, PyObject *arg) {
    double now = PyFloat_AsDouble(arg);
    if (now == -1.0 && PyErr_Occurred()) return NULL;
    if (c->started) { PyErr_SetString(PyExc_RuntimeError, "the call has started"); return NULL; }
    int r = call_start(c, now);
    if (r) return call_error(c, r);
    return outbox_list(c->ep);
}

static PyObject *Call_on_datagram(Call *c, PyObject *args) {
    Py_buffer d;
    double now;
    if (!PyArg_ParseTuple(args, "y*d", &d, &now)) return NULL;
    int r = ep_on_datagram(c->ep, d.buf, d.len, now);
    PyBuffer_Release(&d);
    if (r) return call_error(c, r);
    call_check(c, now);
    Py_RETURN_NONE;
}

static PyObject *Call_on_timer(Call *c, PyObject *arg) {
    double now = PyFloat_AsDouble(arg);
    if (now == -1.0 && PyErr_Occurred()) return NULL;
    int r = call_timer(c, now);
    if (r == -3) {
        PyObject *a = Py_BuildValue("(dL)", now - c->ep->last_progress, (long long)c->remaining);
        if (a) { PyErr_SetObject(TimeoutType, a); Py_DECREF(a); }
        return NULL;
    }
    if (r) return call_error(c, r);
    return outbox_list(c->ep);
}

static PyObject *Call_next_wakeup(Call *c, PyObject *Py_UNUSED(x)) {
    return PyFloat_FromDouble(call_next_wakeup(c));
}

/* ------------------------------------------------------------ the whole call */
/* How many outbox entries from `off` go as one send: with GSO, the run of datagrams to
   the same peer of the same length (the last may be shorter), within the kernel's limits
   and `room` iovecs; otherwise one. The datagrams on the wire are the same either way:
   the kernel (or the NIC) cuts a GSO send back into them, in order. */
static unsigned gso_run(Endpoint *e, Py_ssize_t off, unsigned room) {
    if (!e->gso) return 1;
    uint32_t size = e->outlen[off], total = size;
    unsigned k = 1;
    while (k < room && k < GSO_MAX_SEGS && off + k < e->nout &&
           e->outdst[off + k] == e->outdst[off] && e->outlen[off + k] <= size &&
           total + e->outlen[off + k] <= GSO_MAX_BYTES) {
        total += e->outlen[off + k];
        k++;
        if (e->outlen[off + k - 1] < size) break; /* a shorter one ends the run */
    }
    return k;
}

static int flush_outbox(Endpoint *e, int fd) {
    struct mmsghdr msg[BATCH];
    struct iovec iov[BATCH];
    unsigned segs[BATCH];
    union { char buf[CMSG_SPACE(sizeof(uint16_t))]; struct cmsghdr align; } ctrl[BATCH];
    Py_ssize_t off = 0;
    while (off < e->nout) {
        unsigned k = 0, used = 0;
        for (; k < BATCH && used < BATCH && off + used < e->nout; k++) {
            Py_ssize_t at = off + used;
            unsigned run = gso_run(e, at, BATCH - used);
            for (unsigned j = 0; j < run; j++) {
                iov[used + j].iov_base = (void *)e->outp[at + j];
                iov[used + j].iov_len = e->outlen[at + j];
            }
            memset(&msg[k], 0, sizeof msg[k]);
            msg[k].msg_hdr.msg_name = &e->addrs[e->outdst[at]];
            msg[k].msg_hdr.msg_namelen = sizeof(struct sockaddr_in);
            msg[k].msg_hdr.msg_iov = &iov[used];
            msg[k].msg_hdr.msg_iovlen = run;
            if (run > 1) {
                msg[k].msg_hdr.msg_control = ctrl[k].buf;
                msg[k].msg_hdr.msg_controllen = sizeof ctrl[k].buf;
                struct cmsghdr *cm = CMSG_FIRSTHDR(&msg[k].msg_hdr);
                cm->cmsg_level = IPPROTO_UDP;
                cm->cmsg_type = UDP_SEGMENT;
                cm->cmsg_len = CMSG_LEN(sizeof(uint16_t));
                uint16_t size = (uint16_t)e->outlen[at];
                memcpy(CMSG_DATA(cm), &size, sizeof size);
            }
            segs[k] = run;
            used += run;
        }
        int sent = sendmmsg(fd, msg, k, 0);
        if (sent < 0) {
            if (errno == EAGAIN || errno == ENOBUFS) {
                struct pollfd p = {fd, POLLOUT, 0};
                poll(&p, 1, 10);
                continue;
            }
            if (errno == ECONNREFUSED) { off += segs[0]; continue; }
            if (errno == EINTR) continue;
            if (e->gso && (errno == EIO || errno == EINVAL || errno == EMSGSIZE) && segs[0] > 1) {
                e->gso = 0; /* the path cannot segment (no checksum offload, a small MTU) */
                continue;
            }
            return errno;
        }
        for (int m = 0; m < sent; m++) {
            off += segs[m];
            if (segs[m] > 1) e->gso_sends++;
        }
    }
    ep_outbox_sent(e);
    return 0;
}

enum { RUN_TIMEOUT = -3, RUN_SIGNAL = -4 };

static int run_loop(Call *c, int fd, double *now_out) {
    Endpoint *e = c->ep;
    struct mmsghdr *msg = calloc(BATCH, sizeof(struct mmsghdr));
    struct iovec *iov = calloc(BATCH, sizeof(struct iovec));
    struct sockaddr_in *src = calloc(BATCH, sizeof(struct sockaddr_in));
    uint8_t *buf = malloc((size_t)BATCH * (PKT_MAX + 64));
    int err = 0;
    if (!msg || !iov || !src || !buf) { err = -1; goto out; }
    double now = now_s();
    err = call_start(c, now);
    if (!err) err = flush_outbox(e, fd);
    double check_at = now + SIGNAL_CHECK_S;
    Spacing sp = {0.0, 0.0};
    while (!err && !c->done) {
        double wake = call_next_wakeup(c);
        now = now_s();
        double until = (wake < check_at ? wake : check_at) - now;
        double pause_s = c->remaining >= 2 * (int64_t)e->batch ? spacing_nap(&sp, e->batch, until)
                                                                : 0.0;
        if (pause_s > 0) {
            nap(pause_s);
            e->naps++;
            now = now_s();
            until = (wake < check_at ? wake : check_at) - now;
        }
        err = wait_readable(fd, until);
        if (err) break;
        for (int k = 0; k < BATCH; k++) {
            iov[k].iov_base = buf + (size_t)k * (PKT_MAX + 64);
            iov[k].iov_len = PKT_MAX + 64;
            memset(&msg[k], 0, sizeof msg[k]);
            msg[k].msg_hdr.msg_iov = &iov[k];
            msg[k].msg_hdr.msg_iovlen = 1;
            msg[k].msg_hdr.msg_name = &src[k];
            msg[k].msg_hdr.msg_namelen = sizeof src[k];
        }
        int n = recvmmsg(fd, msg, BATCH, MSG_DONTWAIT, NULL);
        if (n < 0) {
            if (errno != EAGAIN && errno != ECONNREFUSED && errno != EINTR) { err = errno; break; }
            n = 0;
        }
        now = now_s();
        if (n > 0) {
            spacing_sample(&sp, now, n, 0.125);
            e->receives++;
            e->received += n;
        }
        for (int k = 0; k < n && !err; k++) {
            if (from_rank(e, &src[k]) < 0) { e->foreign++; continue; }
            err = ep_on_datagram(e, buf + (size_t)k * (PKT_MAX + 64), msg[k].msg_len, now);
            if (!err) call_check(c, now);
        }
        if (err) break;
        err = call_timer(c, now);
        if (!err) err = flush_outbox(e, fd);
        if (!err && now >= check_at) {
            check_at = now + SIGNAL_CHECK_S;
            PyGILState_STATE g = PyGILState_Ensure();
            if (PyErr_CheckSignals() < 0) err = RUN_SIGNAL;
            PyGILState_Release(g);
        }
    }
    *now_out = now;
out:
    free(msg); free(iov); free(src); free(buf);
    return err;
}

static PyObject *Call_run(Call *c, PyObject *arg) {
    int fd = (int)PyLong_AsLong(arg);
    if (fd == -1 && PyErr_Occurred()) return NULL;
    if (c->started) { PyErr_SetString(PyExc_RuntimeError, "the call has started"); return NULL; }
    double now = 0.0;
    int err;
    Py_BEGIN_ALLOW_THREADS
    err = run_loop(c, fd, &now);
    Py_END_ALLOW_THREADS
    if (err == 0) Py_RETURN_NONE;
    if (err == RUN_SIGNAL) return NULL;
    if (err == RUN_TIMEOUT) {
        PyObject *a = Py_BuildValue("(dL)", now - c->ep->last_progress, (long long)c->remaining);
        if (a) { PyErr_SetObject(TimeoutType, a); Py_DECREF(a); }
        return NULL;
    }
    if (err == -1 || err == -2) return call_error(c, err);
    errno = err;
    return PyErr_SetFromErrno(PyExc_OSError);
}

static PyObject *Call_get_done(Call *c, void *Py_UNUSED(x)) { return PyBool_FromLong(c->done); }
static PyObject *Call_get_remaining(Call *c, void *Py_UNUSED(x)) {
    return PyLong_FromLongLong(c->remaining);
}

static PyMethodDef Call_methods[] = {
    {"start", (PyCFunction)Call_start, METH_O, "start(now) -> the first packets"},
    {"on_datagram", (PyCFunction)Call_on_datagram, METH_VARARGS, "on_datagram(data, now)"},
    {"on_timer", (PyCFunction)Call_on_timer, METH_O, "on_timer(now) -> packets to send"},
    {"next_wakeup", (PyCFunction)Call_next_wakeup, METH_NOARGS, "when on_timer has work"},
    {"run", (PyCFunction)Call_run, METH_O, "run(fd): the whole call, the GIL released"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Call_getset[] = {
    {"done", (getter)Call_get_done, NULL, "the call completed", NULL},
    {"remaining", (getter)Call_get_remaining, NULL, "messages still expected", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject CallType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "hostlib._p2pcore.Call",
    .tp_basicsize = sizeof(Call),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "One ring or tree call of one rank (hostlib.ring.RingCall, hostlib.tree.TreeCall).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Call_init,
    .tp_dealloc = (destructor)Call_dealloc,
    .tp_methods = Call_methods,
    .tp_getset = Call_getset,
};

static PyObject *set_errors(PyObject *Py_UNUSED(m), PyObject *args) {
    PyObject *p2p, *timeout;
    if (!PyArg_ParseTuple(args, "OO", &p2p, &timeout)) return NULL;
    Py_XSETREF(P2pErrorType, Py_NewRef(p2p));
    Py_XSETREF(TimeoutType, Py_NewRef(timeout));
    Py_RETURN_NONE;
}

static PyMethodDef module_methods[] = {
    {"set_errors", set_errors, METH_VARARGS,
     "set_errors(P2pError, timeout marker): the exceptions calls raise"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "hostlib._p2pcore",
    "The native core of the point-to-point layer (see hostlib.native).", -1, module_methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__p2pcore(void) {
    if (PyType_Ready(&EndpointType) < 0 || PyType_Ready(&CallType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    P2pErrorType = Py_NewRef(PyExc_RuntimeError);
    TimeoutType = Py_NewRef(PyExc_TimeoutError);
    if (PyModule_AddObjectRef(m, "Endpoint", (PyObject *)&EndpointType) < 0 ||
        PyModule_AddObjectRef(m, "Call", (PyObject *)&CallType) < 0) { Py_DECREF(m); return NULL; }
    PyObject *proto = Py_BuildValue("{s:i,s:i,s:i,s:i,s:i,s:i,s:i}", "P2P_DATA", P2P_DATA,
                                    "P2P_ACK", P2P_ACK, "HEADER", HSIZE, "FLAG_RESEND",
                                    FLAG_RESEND, "FLAG_DUPLICATE", FLAG_DUPLICATE, "FLAG_EARLY",
                                    FLAG_EARLY, "MAX_LANES", MAX_LANES);
    if (!proto || PyModule_AddObject(m, "PROTOCOL", proto) < 0) { Py_XDECREF(proto); Py_DECREF(m); return NULL; }
    PyObject *all = Py_BuildValue("[ssss]", "Call", "Endpoint", "PROTOCOL", "set_errors");
    if (!all || PyModule_AddObject(m, "__all__", all) < 0) { Py_XDECREF(all); Py_DECREF(m); return NULL; }
    return m;
}
