/*
 * hostlib._rnicore: the native per-packet core of the emulated RDMA NIC.
 *
 * Layer: hostlib.transport, under hostlib.transport.rnic_native (the binding) and beside
 * hostlib.transport.rnic (EmulatedRnic, the Python NIC, which is the specification). One
 * RnicCore is one emulated NIC's data path: its UC queue pairs, registered memory and
 * counters, and the frames of hostlib.rocev2, byte for byte:
 *
 *   - post_write builds a WRITE message's RoCEv2 packets (FIRST/MIDDLE/LAST with
 *     immediate, or ONLY; RETH, ImmDt, ICRC) and sends them with sendmmsg;
 *   - poll receives with recvmmsg and runs EmulatedRnic.on_frame's checks in its order
 *     (ICRC, parse, queue pair, source, PSN and UC message state, R_Key and length),
 *     copying each packet's data into the region's buffer (a Python bytearray, held
 *     through the buffer protocol) and queueing completions for the caller.
 *
 * The GIL is released while frames are built, sent, received and checked; a core used
 * by two threads at once refuses the second (RuntimeError) rather than race. Nothing is
 * allocated per packet: one receive batch and one send batch, allocated with the core.
 * The setup (queue pair numbers, PSNs, R_Keys, addresses) stays in Python.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "_netcore.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <zlib.h>

/* RoCEv2 (hostlib/protocol.py's ROCE_* and RoceOpcode; the binding checks these). */
#define UDP_PORT 4791
#define BTH_SIZE 12
#define RETH_SIZE 16
#define IMMDT_SIZE 4
#define ICRC_SIZE 4
#define OP_FIRST 0x26
#define OP_MIDDLE 0x27
#define OP_LAST 0x28
#define OP_LAST_IMM 0x29
#define OP_ONLY 0x2A
#define OP_ONLY_IMM 0x2B
#define PKEY 0xFFFF
#define MASK24 0xFFFFFFu

#define BATCH 64          /* datagrams per recvmmsg / sendmmsg */
#define RECV_SIZE 65536   /* EmulatedRnic's receive buffer: no UDP payload is cut */
#define HEADROOM (BTH_SIZE + RETH_SIZE + IMMDT_SIZE + ICRC_SIZE)

/* EmulatedRnic's counters (hostlib.transport.rnic.RNIC_COUNTERS), in its order. */
enum {
    C_FRAMES_OUT, C_FRAMES_IN, C_COMPLETIONS, C_BAD_ICRC, C_MALFORMED, C_UNKNOWN_QP,
    C_BAD_SOURCE, C_PSN_GAP, C_DUPLICATE, C_OUT_OF_MESSAGE, C_BAD_RKEY, C_BAD_LENGTH,
    NCOUNTERS
};
static const char *const COUNTER_NAMES[NCOUNTERS] = {
    "frames_out", "frames_in", "completions", "bad_icrc", "malformed", "unknown_qp",
    "bad_source", "psn_gap", "duplicate", "out_of_message", "bad_rkey", "bad_length",
};

typedef struct {
    uint32_t qpn, send_psn, recv_psn;
    uint32_t peer_ip, peer_qpn; /* peer_ip in host order */
    int connected, open;
    Py_ssize_t mr;              /* the open message's region (index into mrs) */
    uint64_t begin, at, end;    /* offsets into it: start, next byte, end */
} Qp;

typedef struct {
    Py_buffer view;             /* the region's bytearray, held while the core lives */
    uint64_t va;
    uint32_t rkey;
} Mr;

typedef struct {
    uint32_t qpn, imm, byte_len;
} Done;

typedef struct {
    PyObject_HEAD
    int fd, pmtu, busy, check_icrc;
    uint32_t my_ip;             /* host order */
    Qp *qps;
    Py_ssize_t nqps, last_qp;   /* last_qp: where the previous lookup hit */
    Mr *mrs;
    Py_ssize_t nmrs;
    Done *done;
    Py_ssize_t ndone, cap_done;
    int64_t counters[NCOUNTERS];
    uint8_t *rbuf, *sbuf;       /* BATCH datagrams each */
    struct mmsghdr rmsg[BATCH], smsg[BATCH];
    struct iovec riov[BATCH], siov[BATCH];
    struct sockaddr_in rsrc[BATCH];
} RnicCore;

static inline void put64(uint8_t *p, uint64_t v) { put32(p, (uint32_t)(v >> 32)); put32(p + 4, (uint32_t)v); }
static inline uint64_t get64(const uint8_t *p) { return ((uint64_t)get32(p) << 32) | get32(p + 4); }
static inline int has_reth(unsigned op) { return op == OP_FIRST || op == OP_ONLY || op == OP_ONLY_IMM; }
static inline int has_imm(unsigned op) { return op == OP_LAST_IMM || op == OP_ONLY_IMM; }
static inline int is_last(unsigned op) { return op >= OP_LAST && op <= OP_ONLY_IMM; }

/* CRC-32 (zlib's crc32, the ICRC's polynomial) by carry-less multiplication: the
   folding of Intel's "Fast CRC Computation for Generic Polynomials Using PCLMULQDQ"
   with the constants of Linux's crc32-pclmul (arch/x86/crypto). zlib's table-driven
   crc32 costs 1.7 us per 4 KiB packet here, most of a frame's work; this about a fifth.
   The bytes past the last whole 16, and CPUs without PCLMULQDQ, go to zlib. */
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define HAVE_CLMUL_CRC 1
static int use_clmul;

__attribute__((target("pclmul,sse4.1"))) static inline __m128i fold16(__m128i x, __m128i k, __m128i next) {
    return _mm_xor_si128(_mm_xor_si128(_mm_clmulepi64_si128(x, k, 0x00), _mm_clmulepi64_si128(x, k, 0x11)), next);
}

/* zlib's crc32(crc, p, len) for len >= 64, of the first len & ~15 bytes. */
__attribute__((target("pclmul,sse4.1"))) static uint32_t crc32_clmul(uint32_t crc, const uint8_t *p, size_t len) {
    const __m128i mask32 = _mm_set_epi32(0, 0, 0, -1);
    __m128i x1 = _mm_xor_si128(_mm_loadu_si128((const __m128i *)p), _mm_cvtsi32_si128((int)~crc));
    __m128i x2 = _mm_loadu_si128((const __m128i *)(p + 16)), x3 = _mm_loadu_si128((const __m128i *)(p + 32));
    __m128i x4 = _mm_loadu_si128((const __m128i *)(p + 48));
    __m128i k = _mm_set_epi64x(0x1c6e41596LL, 0x154442bd4LL); /* R2, R1: fold by 512 bits */
    for (p += 64, len -= 64; len >= 64; p += 64, len -= 64) {
        x1 = fold16(x1, k, _mm_loadu_si128((const __m128i *)p));
        x2 = fold16(x2, k, _mm_loadu_si128((const __m128i *)(p + 16)));
        x3 = fold16(x3, k, _mm_loadu_si128((const __m128i *)(p + 32)));
        x4 = fold16(x4, k, _mm_loadu_si128((const __m128i *)(p + 48)));
    }
    k = _mm_set_epi64x(0x0ccaa009eLL, 0x1751997d0LL); /* R4, R3: fold by 128 bits */
    x1 = fold16(fold16(fold16(x1, k, x2), k, x3), k, x4);
    for (; len >= 16; p += 16, len -= 16) x1 = fold16(x1, k, _mm_loadu_si128((const __m128i *)p));
    /* 128 -> 64 bits (R4), 64 -> 32 (R5), then Barrett's reduction (poly, u) */
    x1 = _mm_xor_si128(_mm_srli_si128(x1, 8), _mm_clmulepi64_si128(k, x1, 0x01));
    x1 = _mm_xor_si128(_mm_srli_si128(x1, 4),
                       _mm_clmulepi64_si128(_mm_and_si128(x1, mask32), _mm_set_epi64x(0, 0x163cd6124LL), 0x00));
    k = _mm_set_epi64x(0x1F7011641LL, 0x1DB710641LL);
    __m128i t = _mm_and_si128(_mm_clmulepi64_si128(_mm_and_si128(x1, mask32), k, 0x10), mask32);
    x1 = _mm_xor_si128(x1, _mm_clmulepi64_si128(t, k, 0x00));
    return ~(uint32_t)_mm_extract_epi32(x1, 1);
}
#endif

/* zlib's crc32(crc, p, len), by carry-less multiplication where the CPU can. */
static uint32_t crc32_fast(uint32_t crc, const uint8_t *p, size_t len) {
#ifdef HAVE_CLMUL_CRC
    if (use_clmul && len >= 64) {
        size_t whole = len & ~(size_t)15;
        crc = crc32_clmul(crc, p, len);
        p += whole;
        len -= whole;
    }
#endif
    return (uint32_t)crc32(crc, p, (uInt)len);
}

/* hostlib.rocev2.icrc: the CRC-32 over the masked pseudo-header (eight 0xFF bytes, the
   IPv4 header INA sends with, id 0 and DF, TOS/TTL/checksum ones, and the UDP header,
   checksum ones), then the body with the BTH's FECN/BECN/reserved byte as ones. */
static uint32_t icrc(uint32_t src_ip, uint32_t dst_ip, unsigned src_port, const uint8_t *body,
                     size_t len) {
    uint8_t h[36 + 5];
    unsigned udp_len = (unsigned)(8 + len + ICRC_SIZE);
    memset(h, 0xFF, 8);
    uint8_t *ip = h + 8, *udp = h + 28;
    ip[0] = 0x45; ip[1] = 0xFF; put16(ip + 2, 20 + udp_len); put16(ip + 4, 0); put16(ip + 6, 0x4000);
    ip[8] = 0xFF; ip[9] = 17; put16(ip + 10, 0xFFFF); put32(ip + 12, src_ip); put32(ip + 16, dst_ip);
    put16(udp, src_port); put16(udp + 2, UDP_PORT); put16(udp + 4, udp_len); put16(udp + 6, 0xFFFF);
    memcpy(h + 36, body, 4);
    h[40] = 0xFF;
    return crc32_fast((uint32_t)crc32(0L, h, sizeof h), body + 5, len - 5);
}

static inline uint32_t get_le32(const uint8_t *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

static Qp *find_qp(RnicCore *c, uint32_t qpn) {
    if (c->last_qp < c->nqps && c->qps[c->last_qp].qpn == qpn) return &c->qps[c->last_qp];
    for (Py_ssize_t i = 0; i < c->nqps; i++)
        if (c->qps[i].qpn == qpn) { c->last_qp = i; return &c->qps[i]; }
    return NULL;
}

static Py_ssize_t find_mr(const RnicCore *c, uint32_t rkey) {
    for (Py_ssize_t i = 0; i < c->nmrs; i++)
        if (c->mrs[i].rkey == rkey) return i;
    return -1;
}

/* MemoryRegion.holds, without overflow: va .. va+length inside the region. */
static int mr_holds(const Mr *m, uint64_t va, uint64_t length) {
    uint64_t size = (uint64_t)m->view.len;
    return va >= m->va && va - m->va <= size && length <= size - (va - m->va);
}

/* ------------------------------------------------------------------ receive */
/* EmulatedRnic._sequence: -1 to take the packet, else the counter of its refusal. */
static int sequence(Qp *q, unsigned op, uint32_t psn) {
    uint32_t ahead = (psn - q->recv_psn) & MASK24;
    if (ahead == 0) return -1;
    q->open = 0; /* not the PSN expected: the message in progress is gone */
    if ((ahead & 0x800000u) && !has_reth(op)) return C_DUPLICATE;
    q->recv_psn = psn;
    return has_reth(op) ? -1 : C_PSN_GAP;
}

/* Room for one more completion; 0, or -1 when memory ran out. */
static int done_room(RnicCore *c) {
    if (c->ndone < c->cap_done) return 0;
    Py_ssize_t cap = c->cap_done ? 2 * c->cap_done : 64;
    Done *d = realloc(c->done, (size_t)cap * sizeof *d);
    if (!d) return -1;
    c->done = d;
    c->cap_done = cap;
    return 0;
}

/* EmulatedRnic._write: place the packet's data, complete its message. -1 to take it, a
   counter's index for a refusal, or NCOUNTERS when memory for a completion ran out. */
static int write_packet(RnicCore *c, Qp *q, unsigned op, uint32_t psn, const uint8_t *reth,
                        const uint8_t *imm, const uint8_t *payload, uint64_t n) {
    q->recv_psn = (psn + 1) & MASK24;
    if (reth) {
        Py_ssize_t m = find_mr(c, get32(reth + 8));
        uint64_t va = get64(reth), length = get32(reth + 12);
        if (m < 0 || !mr_holds(&c->mrs[m], va, length)) { q->open = 0; return C_BAD_RKEY; }
        q->mr = m;
        q->open = 1;
        q->begin = q->at = va - c->mrs[m].va;
        q->end = q->begin + length;
    } else if (!q->open) {
        return C_OUT_OF_MESSAGE;
    }
    if (q->at + n > q->end) { q->open = 0; return C_BAD_LENGTH; }
    memcpy((uint8_t *)c->mrs[q->mr].view.buf + q->at, payload, n);
    q->at += n;
    if (!is_last(op)) return -1;
    q->open = 0;
    if (q->at != q->end) return C_BAD_LENGTH;
    if (imm) {
        if (done_room(c) < 0) return NCOUNTERS;
        c->done[c->ndone++] = (Done){q->qpn, get32(imm), (uint32_t)(q->end - q->begin)};
        c->counters[C_COMPLETIONS]++;
    }
    return -1;
}

/* EmulatedRnic.on_frame: one RoCEv2 UDP payload from src_ip:src_port (host order).
   0, or -1 when memory for a completion ran out. */
static int on_frame(RnicCore *c, const uint8_t *d, size_t n, uint32_t src_ip, unsigned src_port) {
    if (n < BTH_SIZE + ICRC_SIZE ||
        (c->check_icrc &&
         get_le32(d + n - ICRC_SIZE) != icrc(src_ip, c->my_ip, src_port, d, n - ICRC_SIZE))) {
        c->counters[C_BAD_ICRC]++;
        return 0;
    }
    unsigned op = d[0];
    size_t at = BTH_SIZE;
    const uint8_t *reth = NULL, *imm = NULL;
    int bad = op < OP_FIRST || op > OP_ONLY_IMM || (d[1] & 0x3F); /* version, pad count */
    if (!bad && has_reth(op)) {
        reth = d + at;
        at += RETH_SIZE;
        bad = n < at + ICRC_SIZE;
    }
    if (!bad && has_imm(op)) {
        imm = d + at;
        at += IMMDT_SIZE;
        bad = n < at + ICRC_SIZE;
    }
    if (bad) { c->counters[C_MALFORMED]++; return 0; }
    Qp *q = find_qp(c, get32(d + 4) & MASK24);
    if (!q || !q->connected) { c->counters[C_UNKNOWN_QP]++; return 0; }
    if (src_ip != q->peer_ip) { c->counters[C_BAD_SOURCE]++; return 0; }
    uint32_t psn = get32(d + 8) & MASK24;
    int refused = sequence(q, op, psn);
    if (refused < 0) refused = write_packet(c, q, op, psn, reth, imm, d + at, n - ICRC_SIZE - at);
    if (refused == NCOUNTERS) return -1;
    if (refused >= 0) c->counters[refused]++;
    return 0;
}

/* EmulatedRnic._receive: wait up to `timeout` for the socket, then take frames until a
   completion is ready or none is left. 0, or an errno. */
static int receive(RnicCore *c, double timeout) {
    int err = wait_readable(c->fd, timeout);
    if (err) return err;
    while (c->ndone == 0) {
        for (int k = 0; k < BATCH; k++) {
            c->riov[k] = (struct iovec){c->rbuf + (size_t)k * RECV_SIZE, RECV_SIZE};
            c->rmsg[k].msg_hdr = (struct msghdr){.msg_name = &c->rsrc[k], .msg_namelen = sizeof c->rsrc[k],
                                                 .msg_iov = &c->riov[k], .msg_iovlen = 1};
        }
        int got = recvmmsg(c->fd, c->rmsg, BATCH, MSG_DONTWAIT, NULL);
        if (got < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
            /* an ICMP error for an earlier send, or a signal: nothing to receive */
            if (errno == ECONNREFUSED || errno == EHOSTUNREACH || errno == EINTR) continue;
            return errno;
        }
        for (int k = 0; k < got; k++) {
            c->counters[C_FRAMES_IN]++;
            if (on_frame(c, c->rbuf + (size_t)k * RECV_SIZE, c->rmsg[k].msg_len,
                         ntohl(c->rsrc[k].sin_addr.s_addr), ntohs(c->rsrc[k].sin_port)) < 0)
                return ENOMEM;
        }
    }
    return 0;
}

/* -------------------------------------------------------------------- send */
/* The packets of a WRITE of `len` bytes: at least one (a WRITE of nothing is ONLY). */
static Py_ssize_t message_packets(const RnicCore *c, size_t len) {
    return len ? (Py_ssize_t)((len + (size_t)c->pmtu - 1) / (size_t)c->pmtu) : 1;
}

/* Packet k of a message of `packets` (hostlib.rocev2.message_opcode). */
static unsigned message_opcode(Py_ssize_t k, Py_ssize_t packets, int immediate) {
    if (packets == 1) return immediate ? OP_ONLY_IMM : OP_ONLY;
    if (k == 0) return OP_FIRST;
    if (k == packets - 1) return immediate ? OP_LAST_IMM : OP_LAST;
    return OP_MIDDLE;
}

/* hostlib.rocev2.build_frame of packet k of a WRITE into `out`; its length. */
static size_t build_packet(const RnicCore *c, const Qp *q, uint32_t psn, unsigned op,
                           const uint8_t *chunk, size_t len, uint64_t va, uint32_t rkey,
                           uint32_t dma_length, uint32_t imm, uint8_t *out) {
    out[0] = (uint8_t)op;
    out[1] = 0;
    put16(out + 2, PKEY);
    put32(out + 4, q->peer_qpn);
    put32(out + 8, psn);
    size_t at = BTH_SIZE;
    if (has_reth(op)) {
        put64(out + at, va); put32(out + at + 8, rkey); put32(out + at + 12, dma_length);
        at += RETH_SIZE;
    }
    if (has_imm(op)) { put32(out + at, imm); at += IMMDT_SIZE; }
    memcpy(out + at, chunk, len);
    at += len;
    uint32_t crc = icrc(c->my_ip, q->peer_ip, UDP_PORT, out, at);
    out[at] = (uint8_t)crc; out[at + 1] = (uint8_t)(crc >> 8);
    out[at + 2] = (uint8_t)(crc >> 16); out[at + 3] = (uint8_t)(crc >> 24);
    return at + ICRC_SIZE;
}

/* Send the first `count` frames of the send batch to the queue pair's peer; a full
   socket buffer waits for room. The number sent (all, or fewer and *err set). */
static int send_batch(RnicCore *c, const Qp *q, int count, int *err) {
    struct sockaddr_in to = {.sin_family = AF_INET, .sin_port = htons(UDP_PORT),
                             .sin_addr.s_addr = htonl(q->peer_ip)};
    for (int k = 0; k < count; k++) {
        c->smsg[k].msg_hdr = (struct msghdr){.msg_name = &to, .msg_namelen = sizeof to,
                                             .msg_iov = &c->siov[k], .msg_iovlen = 1};
    }
    int off = 0;
    while (off < count) {
        int n = sendmmsg(c->fd, c->smsg + off, (unsigned)(count - off), 0);
        if (n >= 0) { off += n; continue; }
        if (errno == EINTR) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK && errno != ENOBUFS) { *err = errno; break; }
        struct pollfd p = {c->fd, POLLOUT, 0};
        poll(&p, 1, 10);
    }
    return off;
}

/* post_write's work, the GIL released: the message's packets built and sent, the PSNs
   of those sent (and of the one a send failed on) taken, as EmulatedRnic does. With
   `area` (build_write): built there instead, packet i at i * stride, its length in
   lengths[i], nothing sent. 0, or an errno. */
static int write_message(RnicCore *c, Qp *q, const uint8_t *data, size_t len, uint64_t va,
                         uint32_t rkey, long long imm, uint8_t *area, size_t *lengths) {
    Py_ssize_t packets = message_packets(c, len);
    size_t stride = (size_t)c->pmtu + HEADROOM;
    for (Py_ssize_t base = 0; base < packets; base += BATCH) {
        int count = packets - base < BATCH ? (int)(packets - base) : BATCH;
        uint32_t psn0 = q->send_psn;
        for (int k = 0; k < count; k++) {
            Py_ssize_t i = base + k;
            size_t from = (size_t)i * (size_t)c->pmtu;
            size_t chunk = len - from < (size_t)c->pmtu ? len - from : (size_t)c->pmtu;
            uint8_t *out = area ? area + (size_t)i * stride : c->sbuf + (size_t)k * stride;
            size_t flen = build_packet(c, q, (psn0 + (uint32_t)k) & MASK24,
                                       message_opcode(i, packets, imm >= 0), data + from, chunk,
                                       va, rkey, (uint32_t)len, (uint32_t)imm, out);
            c->siov[k] = (struct iovec){out, flen};
            if (lengths) lengths[i] = flen;
        }
        if (area) {
            q->send_psn = (psn0 + (uint32_t)count) & MASK24;
            continue;
        }
        int err = 0, sent = send_batch(c, q, count, &err);
        c->counters[C_FRAMES_OUT] += sent;
        q->send_psn = (psn0 + (uint32_t)sent + (err ? 1 : 0)) & MASK24;
        if (err) return err;
    }
    return 0;
}

/* ------------------------------------------------------------------ Python */

/* For the methods that keep the GIL but change what a released one reads (the tables,
   a queue pair's state): refuse while another thread is inside post_write or poll. */
static int idle(RnicCore *c) {
    if (!c->busy) return 0;
    PyErr_SetString(PyExc_RuntimeError, "the emulated RNIC is in use by another thread");
    return -1;
}

/* post_write and poll, which release the GIL: one thread at a time, or they would race. */
static int enter(RnicCore *c) {
    if (idle(c) < 0) return -1;
    c->busy = 1;
    return 0;
}

static Qp *qp_arg(RnicCore *c, unsigned int qpn) {
    Qp *q = find_qp(c, qpn);
    if (!q) PyErr_Format(PyExc_ValueError, "no queue pair 0x%x", qpn);
    return q;
}

static PyObject *errno_error(int err) {
    if (err == ENOMEM) return PyErr_NoMemory();
    errno = err;
    return PyErr_SetFromErrno(PyExc_OSError);
}

static int RnicCore_init(RnicCore *c, PyObject *args, PyObject *kwds) {
    static char *kw[] = {"fd", "address", "pmtu", NULL};
    unsigned int address;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "iIi", kw, &c->fd, &address, &c->pmtu)) return -1;
    if (c->rbuf) {
        PyErr_SetString(PyExc_RuntimeError, "an RnicCore is initialised once");
        return -1;
    }
    if (c->pmtu < 4 || c->pmtu > 4096 || c->pmtu % 4) {
        PyErr_Format(PyExc_ValueError, "path MTU %d", c->pmtu);
        return -1;
    }
    c->my_ip = address;
    c->check_icrc = 1;
    c->rbuf = malloc((size_t)BATCH * RECV_SIZE);
    c->sbuf = malloc((size_t)BATCH * ((size_t)c->pmtu + HEADROOM));
    if (!c->rbuf || !c->sbuf) { PyErr_NoMemory(); return -1; }
    return 0;
}

static void RnicCore_dealloc(RnicCore *c) {
    for (Py_ssize_t i = 0; i < c->nmrs; i++) PyBuffer_Release(&c->mrs[i].view);
    free(c->mrs); free(c->qps); free(c->done); free(c->rbuf); free(c->sbuf);
    Py_TYPE(c)->tp_free((PyObject *)c);
}

static PyObject *RnicCore_add_mr(RnicCore *c, PyObject *args) {
    unsigned int rkey;
    unsigned long long va;
    PyObject *buf;
    if (idle(c) < 0 || !PyArg_ParseTuple(args, "IKO", &rkey, &va, &buf)) return NULL;
    if (find_mr(c, rkey) >= 0) return PyErr_Format(PyExc_ValueError, "R_Key 0x%x is registered", rkey);
    Mr *mrs = realloc(c->mrs, (size_t)(c->nmrs + 1) * sizeof *mrs);
    if (!mrs) return PyErr_NoMemory();
    c->mrs = mrs;
    if (PyObject_GetBuffer(buf, &mrs[c->nmrs].view, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) return NULL;
    mrs[c->nmrs].va = va;
    mrs[c->nmrs].rkey = rkey;
    c->nmrs++;
    Py_RETURN_NONE;
}

static PyObject *RnicCore_add_qp(RnicCore *c, PyObject *args) {
    unsigned int qpn, send_psn;
    if (idle(c) < 0 || !PyArg_ParseTuple(args, "II", &qpn, &send_psn)) return NULL;
    if (qpn > MASK24 || send_psn > MASK24)
        return PyErr_Format(PyExc_ValueError, "queue pair 0x%x or PSN 0x%x outside 24 bits", qpn, send_psn);
    if (find_qp(c, qpn)) return PyErr_Format(PyExc_ValueError, "queue pair 0x%x exists", qpn);
    Qp *qps = realloc(c->qps, (size_t)(c->nqps + 1) * sizeof *qps);
    if (!qps) return PyErr_NoMemory();
    c->qps = qps;
    qps[c->nqps++] = (Qp){.qpn = qpn, .send_psn = send_psn};
    Py_RETURN_NONE;
}

static PyObject *RnicCore_connect(RnicCore *c, PyObject *args) {
    unsigned int qpn, peer_ip, peer_qpn, recv_psn;
    if (idle(c) < 0 || !PyArg_ParseTuple(args, "IIII", &qpn, &peer_ip, &peer_qpn, &recv_psn)) return NULL;
    if (peer_qpn > MASK24 || recv_psn > MASK24)
        return PyErr_Format(PyExc_ValueError, "queue pair 0x%x or PSN 0x%x outside 24 bits", peer_qpn, recv_psn);
    Qp *q = qp_arg(c, qpn);
    if (!q) return NULL;
    q->peer_ip = peer_ip;
    q->peer_qpn = peer_qpn;
    q->recv_psn = recv_psn;
    q->connected = 1;
    q->open = 0;
    Py_RETURN_NONE;
}

static PyObject *RnicCore_qp_state(RnicCore *c, PyObject *arg) {
    unsigned long qpn = PyLong_AsUnsignedLong(arg);
    if (qpn == (unsigned long)-1 && PyErr_Occurred()) return NULL;
    Qp *q = qp_arg(c, (unsigned int)qpn);
    if (!q) return NULL;
    return Py_BuildValue("(kkO)", (unsigned long)q->send_psn, (unsigned long)q->recv_psn,
                         q->open ? Py_True : Py_False);
}

/* The arguments of post_write and build_write: (qpn, data, va, rkey, imm or -1). */
typedef struct {
    Qp *q;
    Py_buffer data;
    unsigned long long va;
    unsigned int rkey;
    long long imm;
} WriteArgs;

static int write_args(RnicCore *c, PyObject *args, WriteArgs *w) {
    unsigned int qpn;
    if (!PyArg_ParseTuple(args, "Iy*KIL", &qpn, &w->data, &w->va, &w->rkey, &w->imm)) return -1;
    w->q = qp_arg(c, qpn);
    const char *why = !w->q ? NULL
                      : !w->q->connected ? "queue pair 0x%x is not connected"
                      : w->data.len % 4 ? "a payload not whole 32-bit words, on queue pair 0x%x"
                      : w->data.len > 0xFFFFFFFFLL ? "a message over 4 GiB, on queue pair 0x%x"
                      : w->imm > 0xFFFFFFFFLL || w->imm < -1 ? "an immediate outside 32 bits, on 0x%x"
                      : NULL;
    if (w->q && !why) return 0;
    if (why) PyErr_Format(PyExc_ValueError, why, qpn);
    PyBuffer_Release(&w->data);
    return -1;
}

static PyObject *RnicCore_post_write(RnicCore *c, PyObject *args) {
    WriteArgs w;
    if (write_args(c, args, &w) < 0) return NULL;
    if (enter(c) < 0) { PyBuffer_Release(&w.data); return NULL; }
    int err;
    Py_BEGIN_ALLOW_THREADS
    err = write_message(c, w.q, w.data.buf, (size_t)w.data.len, w.va, w.rkey, w.imm, NULL, NULL);
    Py_END_ALLOW_THREADS
    c->busy = 0;
    PyBuffer_Release(&w.data);
    if (err) return errno_error(err);
    Py_RETURN_NONE;
}

static PyObject *RnicCore_build_write(RnicCore *c, PyObject *args) {
    WriteArgs w;
    if (idle(c) < 0 || write_args(c, args, &w) < 0) return NULL;
    Py_ssize_t packets = message_packets(c, (size_t)w.data.len);
    size_t stride = (size_t)c->pmtu + HEADROOM;
    uint8_t *area = malloc((size_t)packets * stride);
    size_t *lengths = malloc((size_t)packets * sizeof *lengths);
    PyObject *out = NULL;
    if (area && lengths) {
        write_message(c, w.q, w.data.buf, (size_t)w.data.len, w.va, w.rkey, w.imm, area, lengths);
        out = PyList_New(packets);
        for (Py_ssize_t i = 0; out && i < packets; i++) {
            PyObject *f = PyBytes_FromStringAndSize((char *)area + (size_t)i * stride, (Py_ssize_t)lengths[i]);
            if (!f) Py_CLEAR(out);
            else PyList_SET_ITEM(out, i, f);
        }
    } else {
        PyErr_NoMemory();
    }
    free(area); free(lengths);
    PyBuffer_Release(&w.data);
    return out;
}

/* The completions ready, as (qpn, imm, byte_len) tuples; the queue emptied. */
static PyObject *take_done(RnicCore *c) {
    PyObject *out = PyList_New(c->ndone);
    for (Py_ssize_t i = 0; out && i < c->ndone; i++) {
        Done *d = &c->done[i];
        PyObject *t = Py_BuildValue("(kkk)", (unsigned long)d->qpn, (unsigned long)d->imm,
                                    (unsigned long)d->byte_len);
        if (!t) Py_CLEAR(out);
        else PyList_SET_ITEM(out, i, t);
    }
    if (out) c->ndone = 0;
    return out;
}

static PyObject *RnicCore_poll(RnicCore *c, PyObject *arg) {
    double timeout = PyFloat_AsDouble(arg);
    if (timeout == -1.0 && PyErr_Occurred()) return NULL;
    if (c->ndone == 0) {
        if (enter(c) < 0) return NULL;
        int err;
        Py_BEGIN_ALLOW_THREADS
        err = receive(c, timeout);
        Py_END_ALLOW_THREADS
        c->busy = 0;
        if (err) return errno_error(err);
    }
    return take_done(c);
}

static PyObject *RnicCore_on_frame(RnicCore *c, PyObject *args) {
    Py_buffer data;
    unsigned int src_ip, src_port;
    if (idle(c) < 0 || !PyArg_ParseTuple(args, "y*II", &data, &src_ip, &src_port)) return NULL;
    int err = on_frame(c, data.buf, (size_t)data.len, src_ip, src_port & 0xFFFF);
    PyBuffer_Release(&data);
    if (err < 0) return PyErr_NoMemory();
    Py_RETURN_NONE;
}

static PyObject *RnicCore_counters(RnicCore *c, PyObject *Py_UNUSED(x)) {
    PyObject *out = PyTuple_New(NCOUNTERS);
    for (int i = 0; out && i < NCOUNTERS; i++) {
        PyObject *v = PyLong_FromLongLong(c->counters[i]);
        if (!v) Py_CLEAR(out);
        else PyTuple_SET_ITEM(out, i, v);
    }
    return out;
}

static PyObject *RnicCore_set_check_icrc(RnicCore *c, PyObject *arg) {
    int on = PyObject_IsTrue(arg);
    if (on < 0) return NULL;
    c->check_icrc = on;
    Py_RETURN_NONE;
}

static PyMethodDef RnicCore_methods[] = {
    {"set_check_icrc", (PyCFunction)RnicCore_set_check_icrc, METH_O,
     "set_check_icrc(on): off, a received frame's ICRC is taken as right"},
    {"add_mr", (PyCFunction)RnicCore_add_mr, METH_VARARGS,
     "add_mr(rkey, va, buffer): register a writable buffer (held while the core lives)"},
    {"add_qp", (PyCFunction)RnicCore_add_qp, METH_VARARGS, "add_qp(qpn, send_psn)"},
    {"connect", (PyCFunction)RnicCore_connect, METH_VARARGS,
     "connect(qpn, peer_ip, peer_qpn, recv_psn): peer_ip an int in host order"},
    {"qp_state", (PyCFunction)RnicCore_qp_state, METH_O, "qp_state(qpn) -> (send_psn, recv_psn, open)"},
    {"post_write", (PyCFunction)RnicCore_post_write, METH_VARARGS,
     "post_write(qpn, data, va, rkey, imm or -1): send one WRITE message"},
    {"build_write", (PyCFunction)RnicCore_build_write, METH_VARARGS,
     "build_write(qpn, data, va, rkey, imm or -1) -> post_write's frames, not sent"},
    {"poll", (PyCFunction)RnicCore_poll, METH_O,
     "poll(timeout) -> [(qpn, imm, byte_len)]: receive until a completion or none left"},
    {"on_frame", (PyCFunction)RnicCore_on_frame, METH_VARARGS,
     "on_frame(data, src_ip, src_port): take one RoCEv2 UDP payload by hand"},
    {"counters", (PyCFunction)RnicCore_counters, METH_NOARGS, "the counters, in COUNTERS order"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject RnicCoreType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "hostlib._rnicore.RnicCore",
    .tp_basicsize = sizeof(RnicCore),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "An emulated RNIC's data path (hostlib.transport.rnic.EmulatedRnic's).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)RnicCore_init,
    .tp_dealloc = (destructor)RnicCore_dealloc,
    .tp_methods = RnicCore_methods,
};

/* The ICRC's CRC-32, for the test that holds it to zlib.crc32. */
static PyObject *module_crc32(PyObject *Py_UNUSED(m), PyObject *args) {
    Py_buffer data;
    unsigned int value = 0;
    if (!PyArg_ParseTuple(args, "y*|I", &data, &value)) return NULL;
    uint32_t crc = crc32_fast(value, data.buf, (size_t)data.len);
    PyBuffer_Release(&data);
    return PyLong_FromUnsignedLong(crc);
}

static PyMethodDef module_methods[] = {
    {"crc32", module_crc32, METH_VARARGS, "crc32(data, value=0): zlib.crc32's, as the ICRC computes it"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "hostlib._rnicore",
    "The native core of the emulated RNIC (see hostlib.transport.rnic_native).", -1,
    module_methods, NULL, NULL, NULL, NULL,
};

static PyObject *protocol_dict(void) {
    PyObject *names = PyTuple_New(NCOUNTERS);
    for (int i = 0; names && i < NCOUNTERS; i++) {
        PyObject *s = PyUnicode_FromString(COUNTER_NAMES[i]);
        if (!s) Py_CLEAR(names);
        else PyTuple_SET_ITEM(names, i, s);
    }
    if (!names) return NULL;
    return Py_BuildValue(
        "{s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:N}", "ROCE_UDP_PORT", UDP_PORT,
        "ROCE_BTH_SIZE", BTH_SIZE, "ROCE_RETH_SIZE", RETH_SIZE, "ROCE_IMMDT_SIZE", IMMDT_SIZE,
        "ROCE_ICRC_SIZE", ICRC_SIZE, "UC_WRITE_FIRST", OP_FIRST, "UC_WRITE_MIDDLE", OP_MIDDLE,
        "UC_WRITE_LAST", OP_LAST, "UC_WRITE_LAST_IMM", OP_LAST_IMM, "UC_WRITE_ONLY", OP_ONLY,
        "UC_WRITE_ONLY_IMM", OP_ONLY_IMM, "DEFAULT_PKEY", PKEY, "COUNTERS", names);
}

PyMODINIT_FUNC PyInit__rnicore(void) {
#ifdef HAVE_CLMUL_CRC
    __builtin_cpu_init();
    use_clmul = __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.1");
#endif
    if (PyType_Ready(&RnicCoreType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    if (PyModule_AddObjectRef(m, "RnicCore", (PyObject *)&RnicCoreType) < 0) { Py_DECREF(m); return NULL; }
    PyObject *proto = protocol_dict();
    if (!proto || PyModule_AddObject(m, "PROTOCOL", proto) < 0) { Py_XDECREF(proto); Py_DECREF(m); return NULL; }
    PyObject *all = Py_BuildValue("[sss]", "RnicCore", "PROTOCOL", "crc32");
    if (!all || PyModule_AddObject(m, "__all__", all) < 0) { Py_XDECREF(all); Py_DECREF(m); return NULL; }
    return m;
}
