/* roce.bpf.h: INA over RoCEv2 in the eBPF data plane, included by ina.bpf.c after its
 * INA path, whose slot code (slot_data), emitting (emit_one, learn) and counters it uses.
 *
 * The semantics are emulation/softswitch/roce.py's (RoceFront, the reference), in its
 * order: the ingress drop simulator; the parse (truncated, malformed); the ICRC
 * (bad_icrc); roce_requests (unknown_qp); roce_jobs (unknown_job); the source address
 * (bad_source); the queue pair's UC responder step under its lock (bad_psn; RETH checks:
 * malformed, bad_length, bad_slot); then the pipeline's checks and the slot, as the INA
 * DATA packet of the message's rank, slot, set, seq and exponent (docs/protocol.md, "INA
 * over RoCEv2"). Each result replica becomes a WRITE to its worker's queue pair: the
 * headers are reshaped in place for the reply's opcode (bpf_skb_adjust_room after the
 * IPv4 header), the PSN taken from the reply queue pair's register before the egress
 * drop simulator (a dropped reply leaves a PSN gap, as a loss on the wire does), and the
 * ICRC recomputed.
 *
 * The ICRC (hostlib/rocev2.py's icrc: the masked IPv4/UDP pseudo-header of a frame with
 * IPv4 identification 0 and DF, the BTH with its FECN/BECN byte masked): a CRC-32 with
 * icrc.py's tables, slicing-by-4. The lanes of a frame, of any length, go through
 * bpf_loop in 64-byte chunks; the replies of one result share their lanes, so those are
 * run once and each reply's headers are joined to them by ina_crc_shift (the register's
 * advance over the lanes' length of zero bytes).
 *
 * The code is compiled with INA_ROCE only (EbpfDataplane(roce=True)): a second caller of
 * slot_data's lane loops doubles the verifier's work, which a 2,048-lane program (more
 * than a RoCEv2 packet holds anyway) cannot bear.
 */

#define ROCE_HDR_MAX (ROCE_BTH_SIZE + ROCE_RETH_SIZE + ROCE_IMMDT_SIZE)
#define ICRC_PSEUDO (8 + IP_BYTES + UDP_BYTES) /* the LRH's ones, IPv4, UDP */
#define ICRC_WORDS ((ICRC_PSEUDO + ROCE_HDR_MAX) / 4)
#define CRC_CHUNK 64
#define PKT_OFF_MASK 0x3FFF /* offsets into a frame: under 16 KiB (a jumbo frame is 9 K) */

/* ------------------------------------------------------------------ maps (tables) */
struct {
    __uint(type, BPF_MAP_TYPE_HASH);
    __uint(max_entries, 1024);
    __type(key, __u32);
    __type(value, __u32); /* log2 of the job's packets per message */
} roce_jobs SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_HASH);
    __uint(max_entries, ROCE_QP_REGISTERS);
    __type(key, __u32); /* the switch's queue pair */
    __type(value, struct ina_roce_request);
} roce_requests SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_HASH);
    __uint(max_entries, ROCE_QP_REGISTERS);
    __type(key, struct ina_roce_reply_key);
    __type(value, struct ina_roce_reply);
} roce_replies SEC(".maps");

/* The per-queue-pair registers: max_entries is set to the switch's count before loading. */
struct {
    __uint(type, BPF_MAP_TYPE_ARRAY);
    __uint(max_entries, 1);
    __type(key, __u32);
    __type(value, struct ina_roce_qp);
} roce_qps SEC(".maps");

/* The workers table read the other way: (IPv4, UDP port, job) -> rank. */
struct {
    __uint(type, BPF_MAP_TYPE_HASH);
    __uint(max_entries, 32768);
    __type(key, struct ina_rank_key);
    __type(value, __u32);
} worker_ranks SEC(".maps");

#ifdef INA_ROCE /* the maps above always exist (one layout for the control plane) */
/* The ICRC's pseudo-header and headers, as words: per CPU, not on the 512-byte stack. */
struct icrc_words {
    __u32 w[ICRC_WORDS];
};

struct {
    __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
    __uint(max_entries, 1);
    __type(key, __u32);
    __type(value, struct icrc_words);
} icrc_scratch SEC(".maps");

static __always_inline __u32 *icrc_buffer(void)
{
    __u32 zero = 0;
    struct icrc_words *s = bpf_map_lookup_elem(&icrc_scratch, &zero);
    if (s)
        __builtin_memset(s, 0, sizeof(*s));
    return s ? s->w : NULL;
}

/* ------------------------------------------------------------------ the ICRC */
static __always_inline __u32 crc_word(__u32 c, __u32 w)
{
    c ^= w; /* w: four bytes as a little-endian word, the reflected CRC's order */
    return ina_crc32[3][c & 0xFF] ^ ina_crc32[2][(c >> 8) & 0xFF] ^
           ina_crc32[1][(c >> 16) & 0xFF] ^ ina_crc32[0][c >> 24];
}

struct crc_walk {
    struct __sk_buff *skb;
    __u32 off;
    __u32 crc;
};

static long crc_chunk(__u32 i, void *arg)
{
    struct crc_walk *w = arg;
    void *data = (void *)(long)w->skb->data;
    void *end = (void *)(long)w->skb->data_end;
    __u32 *p = data + ((w->off + i * CRC_CHUNK) & PKT_OFF_MASK);
    if ((void *)(p + CRC_CHUNK / 4) > end)
        return 1;
    __u32 c = w->crc;
#pragma unroll
    for (int k = 0; k < CRC_CHUNK / 4; k++)
        c = crc_word(c, p[k]);
    w->crc = c;
    return 0;
}

static long crc_byte(__u32 i, void *arg)
{
    struct crc_walk *w = arg;
    void *data = (void *)(long)w->skb->data;
    void *end = (void *)(long)w->skb->data_end;
    __u8 *p = data + ((w->off + i) & PKT_OFF_MASK);
    if ((void *)(p + 1) > end)
        return 1;
    w->crc = ina_crc32[0][(w->crc ^ *p) & 0xFF] ^ (w->crc >> 8);
    return 0;
}

/* The CRC register `crc` after `len` bytes of the (linear) frame from `off`. */
static __always_inline __u32 crc_frame(struct __sk_buff *skb, __u32 off, __u32 len, __u32 crc)
{
    struct crc_walk w = {.skb = skb, .off = off, .crc = crc};
    bpf_loop(len / CRC_CHUNK, crc_chunk, &w, 0);
    w.off = off + (len & ~(CRC_CHUNK - 1));
    bpf_loop(len % CRC_CHUNK, crc_byte, &w, 0);
    return w.crc;
}

static __always_inline void put16(__u8 *b, __u16 v)
{
    b[0] = v >> 8;
    b[1] = v & 0xFF;
}

static __always_inline void put32(__u8 *b, __u32 v)
{
    put16(b, v >> 16);
    put16(b + 2, v & 0xFFFF);
}

/* The ICRC's pseudo-header of a frame from src:sport to dst:4791 of `udp_len` UDP bytes
 * (rocev2.icrc: ones for the LRH, TOS, TTL and checksums; identification 0, DF). */
static __always_inline void icrc_pseudo(__u8 *b, __be32 src, __be32 dst, __be16 sport,
                                        __u32 udp_len)
{
#pragma unroll
    for (int i = 0; i < 8; i++)
        b[i] = 0xFF;
    b[8] = 0x45;
    b[9] = 0xFF;
    put16(b + 10, IP_BYTES + udp_len);
    put32(b + 12, IP_DF);
    b[16] = 0xFF;
    b[17] = IPPROTO_UDP;
    b[18] = b[19] = 0xFF;
    __builtin_memcpy(b + 20, &src, 4);
    __builtin_memcpy(b + 24, &dst, 4);
    __builtin_memcpy(b + 28, &sport, 2);
    put16(b + 30, ROCE_UDP_PORT);
    put16(b + 32, udp_len);
    b[34] = b[35] = 0xFF;
    b[ICRC_PSEUDO + 4] = 0xFF; /* the BTH's FECN, BECN and reserved bits */
}

/* The CRC register over the pseudo-header and headers in `words` (a RETH, an ImmDt). */
static __always_inline __u32 crc_head(const __u32 *words, int reth, int imm)
{
    __u32 c = 0xFFFFFFFF;
#pragma unroll
    for (int k = 0; k < (ICRC_PSEUDO + ROCE_BTH_SIZE) / 4; k++)
        c = crc_word(c, words[k]);
    const int at = (ICRC_PSEUDO + ROCE_BTH_SIZE + ROCE_RETH_SIZE) / 4;
    if (reth) {
#pragma unroll
        for (int k = 0; k < ROCE_RETH_SIZE / 4; k++)
            c = crc_word(c, words[(ICRC_PSEUDO + ROCE_BTH_SIZE) / 4 + k]);
    }
    if (imm)
        c = crc_word(c, words[reth ? at : (ICRC_PSEUDO + ROCE_BTH_SIZE) / 4]);
    return c;
}

/* The RETH and ImmDt that follow the BTH at `h` to `to`; `pkt` (one of the two) is the
 * frame's BTH, which must hold them before `end`. */
static __always_inline int roce_copy_ext(__u8 *to, const __u8 *h, const __u8 *pkt, void *end,
                                         int reth, int imm)
{
    if (reth) {
        if ((void *)(pkt + ROCE_BTH_SIZE + ROCE_RETH_SIZE) > end)
            return -1;
        __builtin_memcpy(to + ROCE_BTH_SIZE, h + ROCE_BTH_SIZE, ROCE_RETH_SIZE);
    }
    if (imm) {
        int at = ROCE_BTH_SIZE + (reth ? ROCE_RETH_SIZE : 0);
        if ((void *)(pkt + at + ROCE_IMMDT_SIZE) > end)
            return -1;
        __builtin_memcpy(to + at, h + at, ROCE_IMMDT_SIZE);
    }
    return 0;
}

/* Whether the frame ends with the ICRC its content and addresses give (rocev2.icrc_ok):
 * `n` bytes of UDP payload, `hdr` of them RoCEv2 headers. */
static __always_inline int icrc_ok(struct __sk_buff *skb, __u32 n, __u32 hdr, int reth, int imm)
{
    __u32 *words = icrc_buffer();
    if (!words)
        return 0;
    __u8 *b = (__u8 *)words;
    void *data = (void *)(long)skb->data;
    void *end = (void *)(long)skb->data_end;
    struct iphdr *ip = data + ETH_BYTES;
    struct udphdr *udp = data + ETH_BYTES + IP_BYTES;
    __u8 *h = data + INA_OFF;
    if ((void *)(h + ROCE_BTH_SIZE) > end)
        return 0;
    icrc_pseudo(b, ip->saddr, ip->daddr, udp->source, UDP_BYTES + n);
    __builtin_memcpy(b + ICRC_PSEUDO, h, 4);
    __builtin_memcpy(b + ICRC_PSEUDO + 5, h + 5, ROCE_BTH_SIZE - 5);
    if (roce_copy_ext(b + ICRC_PSEUDO, h, h, end, reth, imm) < 0)
        return 0;
    __u32 c = crc_head(words, reth, imm);
    __u32 len = (n - hdr - ROCE_ICRC_SIZE) & PKT_OFF_MASK;
    c = ~crc_frame(skb, INA_OFF + hdr, len, c);
    data = (void *)(long)skb->data;
    end = (void *)(long)skb->data_end;
    __u8 *t = data + ((INA_OFF + n - ROCE_ICRC_SIZE) & PKT_OFF_MASK);
    if ((void *)(t + 4) > end)
        return 0;
    return c == ((__u32)t[0] | (__u32)t[1] << 8 | (__u32)t[2] << 16 | (__u32)t[3] << 24);
}

/* ------------------------------------------------------------------ the request */
struct roce_req {
    __u64 va;
    __u32 rkey, dma_length, psn, payload;
    int reth, last;
};

/* The UC responder's step on queue pair register `q` (RoceFront._advance), then the
 * message's packet as an INA slot (_as_ina: its place taken, then advanced): 0, or the
 * counter of the reason to drop it. */
static __always_inline __u32 roce_advance(struct ina_roce_qp *q, const struct roce_req *r,
                                          __u32 packets, __u32 *pidx, __u32 *seq, __s32 *exp)
{
    __u32 why = 0;
    bpf_spin_lock(&q->lock);
    if (r->reth) {
        q->open = 0;
        if (r->rkey >> 16) {
            why = C_DROP_MALFORMED;
            goto out;
        }
        if (r->dma_length != packets * INA_PAYLOAD_BYTES) {
            why = C_DROP_BAD_LENGTH;
            goto out;
        }
        if ((r->rkey & INA_SLOT_MASK) & (packets - 1)) { /* packets: a power of two */
            why = C_DROP_BAD_SLOT;
            goto out;
        }
        q->base = r->rkey;
        q->seq = r->va >> 32;
        q->exponent = (__s8)(r->va >> 24);
        q->place = 0;
    } else if (!q->open || r->psn != q->expect_psn) {
        q->open = 0; /* UC: the rest of the message is dropped too */
        why = C_DROP_BAD_PSN;
        goto out;
    }
    if (q->place >= packets) {
        q->open = 0;
        why = C_DROP_BAD_SLOT;
        goto out;
    }
    q->expect_psn = (r->psn + 1) & ROCE_FIELD_MASK;
    q->open = !r->last;
    if (r->payload != INA_PAYLOAD_BYTES) {
        q->open = 0;
        why = C_DROP_BAD_LENGTH;
        goto out;
    }
    __u32 base = q->base, place = q->place;
    q->place = place + 1;
    *pidx = ((base & INA_POOL_SET_BIT) | ((base & INA_SLOT_MASK) + place)) & 0xFFFF;
    *seq = q->seq;
    *exp = q->exponent;
out:
    bpf_spin_unlock(&q->lock);
    return why;
}

/* ------------------------------------------------------------------ the replies */
struct roce_out {
    __u32 job, seq, shift, packets, position, place, hdr, opcode, lanes_crc;
    __s32 exp;
};

/* The reply's BTH (and RETH, ImmDt) into the frame, its lengths and ICRC: a WRITE to
 * `rep`'s queue pair with PSN `psn`, from `o`'s address to `dst_ip`. */
static __always_inline int roce_write(struct __sk_buff *skb, const struct origin *o,
                                      const struct roce_out *out, struct ina_roce_reply *rep,
                                      __u32 psn, __be32 dst_ip)
{
    __u32 *words = icrc_buffer();
    if (!words)
        return -1;
    __u8 *b = (__u8 *)words, *h = b + ICRC_PSEUDO;
    int reth = out->opcode == ROCE_UC_WRITE_FIRST || out->opcode == ROCE_UC_WRITE_ONLY_IMM;
    int imm = out->opcode == ROCE_UC_WRITE_LAST_IMM || out->opcode == ROCE_UC_WRITE_ONLY_IMM;
    __u32 udp_len = UDP_BYTES + out->hdr + INA_PAYLOAD_BYTES + ROCE_ICRC_SIZE;
    h[0] = out->opcode;
    put16(h + 2, 0xFFFF); /* the default P_Key */
    put32(h + 4, rep->qpn & ROCE_FIELD_MASK);
    put32(h + 8, psn);
    if (reth) {
        put32(h + 12, rep->va >> 32);
        put32(h + 16, rep->va & 0xFFFFFFFF);
        put32(h + 20, rep->rkey);
        put32(h + 24, out->packets * INA_PAYLOAD_BYTES);
    }
    if (imm) /* rocev2.pack_imm: seq's low 24 bits, then the exponent */
        put32(h + (reth ? 28 : 12), (out->seq << 8) | (out->exp & 0xFF));
    void *data = (void *)(long)skb->data;
    void *end = (void *)(long)skb->data_end;
    struct iphdr *ip = data + ETH_BYTES;
    struct udphdr *udp = data + ETH_BYTES + IP_BYTES;
    __u8 *bth = data + INA_OFF;
    if ((void *)(bth + ROCE_BTH_SIZE) > end)
        return -1;
    __builtin_memcpy(bth, h, ROCE_BTH_SIZE);
    if (roce_copy_ext(bth, h, bth, end, reth, imm) < 0)
        return -1;
    ip->tot_len = bpf_htons(IP_BYTES + udp_len);
    udp->len = bpf_htons(udp_len);
    icrc_pseudo(b, o->own_ip, dst_ip, bpf_htons(ROCE_UDP_PORT), udp_len);
    __u32 c = crc_head(words, reth, imm);
    c = ina_crc_shift[0][c & 0xFF] ^ ina_crc_shift[1][(c >> 8) & 0xFF] ^
        ina_crc_shift[2][(c >> 16) & 0xFF] ^ ina_crc_shift[3][c >> 24];
    c = ~(c ^ out->lanes_crc);
    __u8 *t = data + ((INA_OFF + out->hdr + INA_PAYLOAD_BYTES) & PKT_OFF_MASK);
    if ((void *)(t + 4) > end)
        return -1;
    t[0] = c & 0xFF;
    t[1] = (c >> 8) & 0xFF;
    t[2] = (c >> 16) & 0xFF;
    t[3] = c >> 24;
    return 0;
}

/* A reply to the worker at dst_ip:dst_port, whose rank there has a roce_replies entry for
 * the position (else none: nowhere to write, as a table miss drops); `last` as for
 * emit_one. */
static __always_inline int roce_reply(struct __sk_buff *skb, const struct origin *o,
                                      const struct roce_out *out, const __u8 *mac,
                                      __be32 dst_ip, __be16 dst_port, __u32 port, int last,
                                      struct ina_cfg *c)
{
    int miss = last ? TC_ACT_SHOT : 0;
    struct ina_rank_key rk = {.ip = dst_ip, .udp_port = dst_port, .job = out->job};
    __u32 *rank = bpf_map_lookup_elem(&worker_ranks, &rk);
    if (!rank)
        return miss;
    struct ina_roce_reply_key key = {.job = out->job, .rank = *rank, .position = out->position};
    struct ina_roce_reply *rep = bpf_map_lookup_elem(&roce_replies, &key);
    if (!rep)
        return miss;
    __u32 reg = rep->psn_reg;
    struct ina_roce_qp *q = bpf_map_lookup_elem(&roce_qps, &reg);
    if (!q)
        return miss;
    /* Fixed by the message and place (docs/protocol.md): the base is only read. */
    __u32 psn = (q->reply_psn + (out->seq << ROCE_PSN_SEQ_SHIFT) + out->place) & ROCE_FIELD_MASK;
    if (chance(c->drop_eg)) {
        count(C_DROP_SIM_EGRESS);
        return miss;
    }
    if (roce_write(skb, o, out, rep, psn, dst_ip) < 0)
        return miss;
    count(C_RESULTS_SENT);
    return emit_one(skb, o, mac, dst_ip, dst_port, port, last, c);
}

/* A reply per replica of the job's group, as emit_multicast sends results, or the one
 * reply to a retransmission's sender (`unicast`): each is a bpf_loop step (verified once:
 * a bounded loop's 64 bodies, each with its ICRC, were more than the verifier's million
 * instructions; and its own stack frame, which roce()'s could not hold too). */
struct roce_fanout {
    struct __sk_buff *skb;
    const struct origin *o;
    const struct roce_out *out;
    struct ina_cfg *c;
    __u32 mgid, n;
    int action, unicast;
};

static long roce_fanout_one(__u32 i, void *arg)
{
    struct roce_fanout *f = arg;
    const struct origin *o = f->o;
    const __u8 *mac = o->src_mac;
    __be32 ip = o->src_ip;
    __be16 udp_port = o->src_port;
    __u32 port = o->in_port;
    int last = f->unicast || i + 1 == f->n;
    if (!f->unicast) {
        struct ina_group *g = bpf_map_lookup_elem(&groups, &f->mgid);
        if (!g || i >= INA_MAX_REPLICAS)
            return 1;
        struct ina_replica_key k = {.job = f->out->job, .rid = g->replicas[i].rid,
                                    .port = g->replicas[i].port};
        struct ina_dest *d = bpf_map_lookup_elem(&replicas, &k);
        if (!d)
            return 0; /* no replicas entry: not a destination (the action stays: drop) */
        mac = d->mac;
        ip = d->ip;
        udp_port = d->udp_port;
        port = k.port;
    }
    int action = roce_reply(f->skb, o, f->out, mac, ip, udp_port, port, last, f->c);
    if (last)
        f->action = action;
    return f->unicast ? 1 : 0;
}

static __always_inline int roce_send(struct __sk_buff *skb, const struct origin *o,
                                     const struct roce_out *out, struct ina_job *job,
                                     int unicast, struct ina_cfg *c)
{
    struct roce_fanout f = {.skb = skb, .o = o, .out = out, .c = c, .mgid = job->mgid,
                            .action = TC_ACT_SHOT, .unicast = unicast};
    if (unicast) {
        bpf_loop(1, roce_fanout_one, &f, 0);
        return f.action;
    }
    struct ina_group *g = bpf_map_lookup_elem(&groups, &f.mgid);
    if (!g)
        return TC_ACT_SHOT;
    f.n = g->count < INA_MAX_REPLICAS ? g->count : INA_MAX_REPLICAS;
    bpf_loop(f.n, roce_fanout_one, &f, 0);
    return f.action;
}

/* The frame's headers reshaped for the reply's opcode (the lanes stay, after them), and
 * the lanes' CRC register, shared by every reply. */
static __always_inline int roce_reshape(struct __sk_buff *skb, __u32 hdr_in, struct roce_out *out)
{
    __u32 place = out->position & (out->packets - 1); /* position holds the slot here */
    out->place = place;
    out->position >>= out->shift;
    if (out->packets == 1)
        out->opcode = ROCE_UC_WRITE_ONLY_IMM;
    else if (place == 0)
        out->opcode = ROCE_UC_WRITE_FIRST;
    else if (place + 1 == out->packets)
        out->opcode = ROCE_UC_WRITE_LAST_IMM;
    else
        out->opcode = ROCE_UC_WRITE_MIDDLE;
    int reth = out->opcode == ROCE_UC_WRITE_FIRST || out->opcode == ROCE_UC_WRITE_ONLY_IMM;
    int imm = out->opcode == ROCE_UC_WRITE_LAST_IMM || out->opcode == ROCE_UC_WRITE_ONLY_IMM;
    out->hdr = ROCE_BTH_SIZE + (reth ? ROCE_RETH_SIZE : 0) + (imm ? ROCE_IMMDT_SIZE : 0);
    __s32 delta = (__s32)out->hdr - (__s32)hdr_in;
    if (delta && bpf_skb_adjust_room(skb, delta, BPF_ADJ_ROOM_NET, 0) < 0)
        return -1;
    out->lanes_crc = crc_frame(skb, INA_OFF + out->hdr, INA_PAYLOAD_BYTES, 0);
    return 0;
}

/* The partial sum of a job with an upstream switch: RoCEv2 has no upward framing, so, as
 * the reference (its upward DATA packet finds no RoCEv2 reply), it is counted, not sent. */
static __always_inline int roce_upward(struct ina_cfg *c)
{
    if (chance(c->drop_eg))
        return drop(C_DROP_SIM_EGRESS);
    count(C_SENT_UPSTREAM);
    return TC_ACT_SHOT;
}

/* ------------------------------------------------------------------ RoCEv2 */
/* The frame's request fields, after the parse and the ICRC: its queue pair, or -1 and
 * the drop counter in *why. */
static __always_inline __s64 roce_parse(struct __sk_buff *skb, __u32 n, struct roce_req *r,
                                        __u32 *hdr, __u32 *why)
{
    void *data = (void *)(long)skb->data;
    void *end = (void *)(long)skb->data_end;
    __u8 *h = data + INA_OFF;
    *why = C_DROP_TRUNCATED;
    if (n < ROCE_BTH_SIZE + ROCE_ICRC_SIZE || (void *)(h + ROCE_BTH_SIZE) > end)
        return -1;
    __u8 op = h[0];
    *why = C_DROP_MALFORMED; /* not a UC WRITE, a transport version or pad count not 0 */
    if (op < ROCE_UC_WRITE_FIRST || op > ROCE_UC_WRITE_ONLY_IMM || (h[1] & 0x3F))
        return -1;
    r->reth = op == ROCE_UC_WRITE_FIRST || op >= ROCE_UC_WRITE_ONLY;
    int imm = op == ROCE_UC_WRITE_LAST_IMM || op == ROCE_UC_WRITE_ONLY_IMM;
    r->last = op >= ROCE_UC_WRITE_LAST;
    *hdr = ROCE_BTH_SIZE + (r->reth ? ROCE_RETH_SIZE : 0) + (imm ? ROCE_IMMDT_SIZE : 0);
    *why = C_DROP_TRUNCATED;
    if (n < *hdr + ROCE_ICRC_SIZE)
        return -1;
    *why = C_DROP_BAD_ICRC;
    if (!icrc_ok(skb, n, *hdr, r->reth, imm))
        return -1;
    data = (void *)(long)skb->data;
    end = (void *)(long)skb->data_end;
    h = data + INA_OFF;
    if ((void *)(h + ROCE_BTH_SIZE + ROCE_RETH_SIZE) > end && r->reth)
        return -1;
    if ((void *)(h + ROCE_BTH_SIZE) > end)
        return -1;
    r->psn = bpf_ntohl(*(__be32 *)(h + 8)) & ROCE_FIELD_MASK;
    r->payload = n - *hdr - ROCE_ICRC_SIZE;
    if (r->reth && (void *)(h + ROCE_BTH_SIZE + ROCE_RETH_SIZE) <= end) {
        __u64 hi = bpf_ntohl(*(__be32 *)(h + 12)), lo = bpf_ntohl(*(__be32 *)(h + 16));
        r->va = hi << 32 | lo;
        r->rkey = bpf_ntohl(*(__be32 *)(h + 20));
        r->dma_length = bpf_ntohl(*(__be32 *)(h + 24));
    }
    return bpf_ntohl(*(__be32 *)(h + 4)) & ROCE_FIELD_MASK;
}

/* The message's packet as the pipeline's INA DATA packet of `rank` and slot `pidx`
 * (Pipeline.aggregate): the pipeline's checks, the slot, then the replies. */
static __always_inline int roce_aggregate(struct __sk_buff *skb, const struct origin *o,
                                          struct roce_out *out, __u32 rank, __u32 pidx,
                                          __u32 hdr, struct ina_cfg *c)
{
    __u32 job_id = out->job;
    struct ina_job *job = bpf_map_lookup_elem(&jobs, &job_id);
    if (!job)
        return drop(C_DROP_UNKNOWN_JOB);
    if (rank >= job->num_workers)
        return drop(C_DROP_BAD_RANK);
    struct ina_worker_key wk = {.ip = o->src_ip, .udp_port = o->src_port, .job = job_id,
                                .rank = rank};
    if (!bpf_map_lookup_elem(&workers, &wk))
        return drop(C_DROP_BAD_SOURCE);
    __u32 slot_rel = pidx & INA_SLOT_MASK;
    if (slot_rel >= job->slot_count)
        return drop(C_DROP_BAD_SLOT);
    void *data = (void *)(long)skb->data;
    void *end = (void *)(long)skb->data_end;
    __be32 *pkt = data + INA_OFF + (hdr & 63);
    if ((void *)(pkt + INA_LANES) > end)
        return drop(C_DROP_BAD_LENGTH);
    __u32 index = job->slot_base + slot_rel;
    struct ina_slot *slot = bpf_map_lookup_elem(&slots, &index);
    if (!slot)
        return drop(C_DROP_BAD_SLOT);
    struct ina_upstream *up = bpf_map_lookup_elem(&upstream, &job_id);
    __u32 set = pidx & INA_POOL_SET_BIT ? 1 : 0;
    __u32 v = slot_data(slot, set, rank, out->seq, out->exp, job->num_workers,
                        up ? M_UPSTREAM : 0, pkt, &out->exp); /* no sharing over RoCEv2 */
    if (c->one_armed)
        learn(o);
    switch (v) {
    case V_STALE:
        return drop(C_DROP_STALE);
    case V_DUPLICATE:
        count(C_DUPLICATES_IGNORED);
        return TC_ACT_SHOT;
    case V_AGGREGATED:
        count(C_AGGREGATED);
        return TC_ACT_SHOT;
    case V_RESEND_UP:
        count(C_UPSTREAM_RESENT);
        return roce_upward(c);
    case V_COMPLETED:
        count(C_AGGREGATED);
        count(C_COMPLETED);
        if (up)
            return roce_upward(c);
        break;
    default: /* V_ANSWER: DATA never takes a result from upstream */
        count(C_RETRANSMITS_ANSWERED);
    }
    out->position = slot_rel;
    if (roce_reshape(skb, hdr, out) < 0)
        return TC_ACT_SHOT;
    return roce_send(skb, o, out, job, v != V_COMPLETED, c);
}

/* What roce() keeps of a frame: per CPU, as the ICRC's words (the stack of the call chain
 * ina_port, roce, a reply's bpf_loop step is 512 bytes in all). */
struct roce_state {
    struct origin o;
    struct roce_req r;
    struct roce_out out;
};

struct {
    __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
    __uint(max_entries, 1);
    __type(key, __u32);
    __type(value, struct roce_state);
} roce_scratch SEC(".maps");

/* One RoCEv2 frame (UDP to ROCE_UDP_PORT): RoceFront.process. A function of its own
 * (a BPF-to-BPF call): inlined beside ina(), the two paths' locals overflowed the one
 * 512-byte stack. */
static __noinline int roce(struct __sk_buff *skb, __u32 in_port, struct ina_cfg *c)
{
    count(C_RECEIVED);
    if (chance(c->drop_in))
        return drop(C_DROP_SIM_INGRESS);
    if (bpf_skb_pull_data(skb, skb->len) < 0) /* linear: the ICRC covers all of it */
        return drop(C_DROP_TRUNCATED);
    void *data = (void *)(long)skb->data;
    void *end = (void *)(long)skb->data_end;
    struct ethhdr *eth = data;
    struct iphdr *ip = data + ETH_BYTES;
    struct udphdr *udp = data + ETH_BYTES + IP_BYTES;
    if ((void *)(udp + 1) > end)
        return drop(C_DROP_TRUNCATED);
    __u32 zero = 0;
    struct roce_state *st = bpf_map_lookup_elem(&roce_scratch, &zero);
    if (!st)
        return TC_ACT_SHOT;
    __builtin_memset(st, 0, sizeof(*st));
    struct origin *o = &st->o; /* the worker is bound at (its IPv4, ROCE_UDP_PORT): roce.py */
    __builtin_memcpy(o->src_mac, eth->h_source, ETH_ALEN);
    __builtin_memcpy(o->own_mac, eth->h_dest, ETH_ALEN);
    o->src_ip = ip->saddr;
    o->own_ip = ip->daddr;
    o->src_port = o->own_port = bpf_htons(ROCE_UDP_PORT);
    o->in_port = in_port;
    __u32 n = datagram_len(skb, udp), hdr = 0, why;
    __s64 qpn = roce_parse(skb, n, &st->r, &hdr, &why);
    if (qpn < 0)
        return drop(why);
    __u32 key = (__u32)qpn;
    struct ina_roce_request *req = bpf_map_lookup_elem(&roce_requests, &key);
    if (!req)
        return drop(C_DROP_UNKNOWN_QP);
    __u32 job_id = req->job, rank = req->rank, reg = req->qp_reg;
    __u32 *shift = bpf_map_lookup_elem(&roce_jobs, &job_id);
    if (!shift)
        return drop(C_DROP_UNKNOWN_JOB);
    if (o->src_ip != req->ip) /* only the queue pair's worker touches its state */
        return drop(C_DROP_BAD_SOURCE);
    struct ina_roce_qp *q = bpf_map_lookup_elem(&roce_qps, &reg);
    if (!q)
        return drop(C_DROP_UNKNOWN_QP); /* an entry outside the registers: none */
    struct roce_out *out = &st->out;
    out->job = job_id;
    out->shift = *shift & 31;
    out->packets = 1U << out->shift;
    __u32 pidx = 0;
    why = roce_advance(q, &st->r, out->packets, &pidx, &out->seq, &out->exp);
    if (why)
        return drop(why);
    return roce_aggregate(skb, o, out, rank, pidx, hdr, c);
}
#endif /* INA_ROCE */
