/* ina.bpf.c: the INA switch as an eBPF TC classifier (clsact ingress, direct action) on
 * every switch port: the semantics of emulation/softswitch/pipeline.py (Pipeline.process,
 * the reference) and of p4/ina.p4, in the kernel.
 *
 * One frame arriving on a port is, as p4/ina.p4 and frames.py take it:
 * - IPv4 without options, not fragmented, UDP to INA_UDP_PORT: an INA packet, run
 *   through the pipeline's checks in its order, then the slot's registers under the
 *   slot's spin lock (seq check, bitmaps, first-write-then-add, down-counter, max
 *   exponent, final), then one of: consumed, dropped (counted by reason), the result
 *   multicast to the job's replicas (bpf_clone_redirect per copy, bpf_redirect for the
 *   last), the unicast answer to a retransmission out of its ingress port, or the
 *   partial sum sent to the upstream switch (hierarchical aggregation); a job's slots past
 *   its reservation in a shared region of the pool, or passed on unchanged to its
 *   fallback aggregator, whose results come back to be multicast (sharing.bpf.h);
 * - with INA_ROCE (`inalab switch --roce`), IPv4/UDP to ROCE_UDP_PORT: INA over RoCEv2,
 *   a UC RDMA WRITE aggregated as the soft switch's roce.py does, through the same slot
 *   code, answered by WRITEs with their ICRC (roce.bpf.h);
 * - anything else: the forwarder table by destination MAC (a port, a flood group but
 *   the ingress port, or drop: forward.bpf.h).
 * Frames leave through bpf_redirect to the egress port's device, so the port's egress
 * qdisc (HTB: the link's bandwidth) still shapes them. A port's emulated link loses and
 * duplicates frames on egress, and with its ingress flag on ingress too (links.py's
 * semantics, without the delay line: a kernel without netem cannot delay in TC); a frame
 * the link keeps gets a copy with the link's dup probability (on egress a second
 * bpf_clone_redirect; on ingress a copy put at the back of the port's receive queue,
 * bpf_clone_redirect with BPF_F_INGRESS, marked so that the link is not applied to it
 * again). On egress it is held back with the link's reorder probability: TC has no timer
 * to hold a frame with, so the port's shaper does. Such a port's HTB class has two lanes
 * (lanes.py: the emulation makes them) and every frame out of it is put in one by its
 * skb->priority: held back frames in the low-priority one, which sends only while the
 * other has nothing to send, so every frame queued meanwhile overtakes them. As with
 * netem's reordering, only frames that are there can overtake: on an idle link a held
 * back frame keeps its place. On ingress nothing queues, so nothing is reordered there.
 *
 * One-armed (cfg.one_armed: a reduction server, `inalab switch --one-armed IFACE`): the
 * program sits on the ingress of a host's only NIC. INA packets to the host's address
 * (cfg.own_ip), over UDP or (with INA_ROCE) RoCEv2, are aggregated as above, and every answer leaves by that NIC to the next
 * hop toward its worker (the MAC the worker's own packets came from, else the kernel's
 * routes and neighbour table: next_hop, onearmed.bpf.h), so results are unicast datagrams
 * from the host's address; every other frame (ARP, SSH,
 * the P4Runtime connection, INA for other hosts) goes on to the host's stack untouched.
 * That is how a server is a fallback aggregator (sharing.bpf.h): its jobs are behind a
 * switch, which passes their packets on and takes their results.
 *
 * Constants and every struct shared with Python come from ina_gen.h, generated at
 * compile time by layout.py from hostlib/protocol.py. Counters are per CPU.
 */
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/pkt_cls.h>
#include <linux/udp.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

#include "ina_gen.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

#define ETH_BYTES 14
#define IP_BYTES 20
#define UDP_BYTES 8
#define INA_OFF (ETH_BYTES + IP_BYTES + UDP_BYTES)
#define INA_FRAME (INA_OFF + INA_HEADER_SIZE + INA_PAYLOAD_BYTES)
#define IP_DF 0x4000

/* ------------------------------------------------------------------ maps (tables) */
struct {
    __uint(type, BPF_MAP_TYPE_ARRAY);
    __uint(max_entries, 1);
    __type(key, __u32);
    __type(value, struct ina_cfg);
} cfg SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_HASH);
    __uint(max_entries, 1024);
    __type(key, __u32);
    __type(value, struct ina_job);
} jobs SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_HASH);
    __uint(max_entries, 32768);
    __type(key, struct ina_worker_key);
    __type(value, __u32);
} workers SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_HASH);
    __uint(max_entries, 4096);
    __type(key, __u32);
    __type(value, struct ina_group);
} groups SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_HASH);
    __uint(max_entries, 32768);
    __type(key, struct ina_replica_key);
    __type(value, struct ina_dest);
} replicas SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_HASH);
    __uint(max_entries, 1024);
    __type(key, __u32);
    __type(value, struct ina_upstream);
} upstream SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_HASH);
    __uint(max_entries, 1024);
    __type(key, __u64);
    __type(value, struct ina_fwd);
} forward SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_ARRAY);
    __uint(max_entries, INA_MAX_PORTS);
    __type(key, __u32);
    __type(value, struct ina_port);
} ports SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_HASH);
    __uint(max_entries, INA_MAX_PORTS);
    __type(key, __u32);
    __type(value, __u32);
} ifports SEC(".maps");

/* The registers: max_entries is set to the pool's slots per set before loading. */
struct {
    __uint(type, BPF_MAP_TYPE_ARRAY);
    __uint(max_entries, 1);
    __type(key, __u32);
    __type(value, struct ina_slot);
} slots SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
    __uint(max_entries, INA_NUM_COUNTERS);
    __type(key, __u32);
    __type(value, __u64);
} stats SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
    __uint(max_entries, INA_NUM_LINK_COUNTERS);
    __type(key, __u32);
    __type(value, __u64);
} links SEC(".maps");

/* ------------------------------------------------------------------ helpers */
struct ina_hdr {
    __u8 vt;
    __u8 flags;
    __be16 job;
    __u8 rank;
    __s8 exponent;
    __be16 lanes;
    __be16 pool_index;
    __be16 reserved;
    __be32 seq;
} __attribute__((packed));

_Static_assert(sizeof(struct ina_hdr) == INA_HEADER_SIZE, "INA header size");

static __always_inline void count(__u32 index)
{
    __u64 *c = bpf_map_lookup_elem(&stats, &index);
    if (c)
        *c += 1;
}

static __always_inline void count_link(__u32 port, __u32 dir, __u32 what)
{
    __u32 index = (port * 2 + dir) * LINK_NUM_COUNTS + what;
    __u64 *c = bpf_map_lookup_elem(&links, &index);
    if (c)
        *c += 1;
}

/* Bernoulli(threshold / 2**32): never for 0, always for 2**32. */
static __always_inline int chance(__u64 threshold)
{
    return threshold && (__u64)bpf_get_prandom_u32() < threshold;
}

static __always_inline int drop(__u32 reason)
{
    count(reason);
    return TC_ACT_SHOT;
}

/* The mark of an ingress duplicate, put back into its port's receive queue by this
 * program: the same namespace keeps it, and no frame leaves a port with it. */
#define MARK_IN_DUP 0x494e4450u /* "INDP" */

/* The interface of switch port `port`, 0 if it has none; `p` its entry. */
static __always_inline __u32 port_ifindex(__u32 port, struct ina_port **p)
{
    struct ina_port *entry = bpf_map_lookup_elem(&ports, &port);
    *p = entry;
    return entry ? entry->ifindex : 0;
}

/* The frame out of port `port` (interface `ifindex`, entry `p`) through the port's
 * egress link: lost, or sent in its lane (held back or in order, where the port has
 * lanes) after a copy of it (duplicated). `last`: the frame itself goes, and the verdict
 * to return comes back; else a copy goes, the frame stays, and 0 comes back. */
static __always_inline int send_out(struct __sk_buff *skb, __u32 port, __u32 ifindex,
                                    struct ina_port *p, int last)
{
    skb->mark = 0;
    if (p->link & 1) {
        count_link(port, DIR_EGRESS, LINK_OFFERED);
        if (chance(p->loss_eg)) {
            count_link(port, DIR_EGRESS, LINK_LOST);
            return last ? TC_ACT_SHOT : 0;
        }
        count_link(port, DIR_EGRESS, LINK_DELIVERED);
        if (p->link & 4) { /* the port has lanes: every frame goes in one */
            skb->priority = INA_LANE_IN_ORDER;
            if (chance(p->reorder_eg)) {
                count_link(port, DIR_EGRESS, LINK_REORDERED);
                skb->priority = INA_LANE_HELD;
            }
        }
        if (chance(p->dup_eg)) {
            count_link(port, DIR_EGRESS, LINK_DUPLICATED);
            count(C_FRAMES_OUT);
            bpf_clone_redirect(skb, ifindex, 0);
        }
    }
    count(C_FRAMES_OUT);
    if (last)
        return bpf_redirect(ifindex, 0);
    bpf_clone_redirect(skb, ifindex, 0);
    return 0;
}

static __always_inline __u16 ip_checksum(struct iphdr *ip)
{
    __u16 *w = (__u16 *)ip;
    __u32 sum = 0;
#pragma unroll
    for (int i = 0; i < IP_BYTES / 2; i++)
        sum += w[i];
    sum = (sum & 0xFFFF) + (sum >> 16);
    sum = (sum & 0xFFFF) + (sum >> 16);
    return (__u16)~sum;
}

/* Rewrite the frame's Ethernet, IPv4 and UDP headers into one from the switch's INA
 * address (`own_mac`/`own_ip`:`own_port`, what the worker sent to) to `dst`, as frames.py's
 * build_result_frame does: IPv4 id 0, DF, TTL 64; UDP checksum 0. */
static __always_inline int rewrite(struct __sk_buff *skb, const __u8 *dst_mac,
                                   const __u8 *own_mac, __be32 own_ip, __be32 dst_ip,
                                   __be16 own_port, __be16 dst_port)
{
    void *data = (void *)(long)skb->data;
    void *end = (void *)(long)skb->data_end;
    struct ethhdr *eth = data;
    struct iphdr *ip = data + ETH_BYTES;
    struct udphdr *udp = data + ETH_BYTES + IP_BYTES;
    if ((void *)(udp + 1) > end)
        return -1;
    __builtin_memcpy(eth->h_dest, dst_mac, ETH_ALEN);
    __builtin_memcpy(eth->h_source, own_mac, ETH_ALEN);
    ip->tos = 0;
    ip->id = 0;
    ip->frag_off = bpf_htons(IP_DF);
    ip->ttl = 64;
    ip->saddr = own_ip;
    ip->daddr = dst_ip;
    ip->check = 0;
    ip->check = ip_checksum(ip);
    udp->source = own_port;
    udp->dest = dst_port;
    udp->check = 0;
    return 0;
}

/* What the frame the switch answers came with: the worker's and the switch's
 * addresses, read before any rewrite, and the port it arrived on. */
struct origin {
    __u8 src_mac[ETH_ALEN];
    __u8 own_mac[ETH_ALEN];
    __be32 src_ip;
    __be32 own_ip;
    __be16 src_port;
    __be16 own_port; /* INA_UDP_PORT, or ROCE_UDP_PORT */
    __u32 in_port;
};

#include "onearmed.bpf.h" /* one-armed: next_hop, learn */

/* ------------------------------------------------------------------ emitting */
static __always_inline int emit_one(struct __sk_buff *skb, const struct origin *o,
                                    const __u8 *mac, __be32 ip, __be16 udp_port, __u32 port,
                                    int last, struct ina_cfg *c)
{
    __u8 hop[ETH_ALEN];
    if (c->one_armed) { /* every answer leaves by the one port, to the route's next hop */
        if (next_hop(skb, o->own_ip, ip, udp_port, hop) < 0) {
            count(C_NO_ROUTE);
            return last ? TC_ACT_SHOT : 0;
        }
        mac = hop;
        port = o->in_port;
    }
    struct ina_port *p;
    __u32 ifindex = port_ifindex(port, &p);
    if (!ifindex || !p)
        return last ? TC_ACT_SHOT : 0;
    if (rewrite(skb, mac, o->own_mac, o->own_ip, ip, o->own_port, udp_port) < 0)
        return last ? TC_ACT_SHOT : 0;
    return send_out(skb, port, ifindex, p, last);
}

/* The packet (its INA header and payload already the result) to every replica of the
 * job's group that has a replicas entry; the egress drop simulator per replica. Each
 * copy but the group's last is a bpf_clone_redirect; the last is the frame itself
 * (bpf_redirect), one clone and one copy of the frame fewer per result. "Last" is the
 * group's last entry, not the last replica kept: deciding that first would make every
 * subset of kept replicas a verifier state of its own. A global function: the verifier
 * checks its loop once, not once for every way there (a result, the upstream's, the
 * fallback's: inlined, the 64-lane program took 835,000 of the verifier's million
 * instructions and the 2,048-lane one 907,000; so, 128,000 and 200,000). */
__noinline int emit_multicast(struct __sk_buff *skb, const struct origin *o, __u32 job_id,
                              struct ina_job *job, struct ina_cfg *c)
{
    if (!o || !job || !c) /* a global function's pointers may be NULL, to the verifier */
        return TC_ACT_SHOT;
    __u32 mgid = job->mgid;
    struct ina_group *g = bpf_map_lookup_elem(&groups, &mgid);
    if (!g)
        return TC_ACT_SHOT;
    __u32 n = g->count;
    for (__u32 i = 0; i < INA_MAX_REPLICAS; i++) {
        if (i >= n)
            break;
        int last = i + 1 == n;
        g = bpf_map_lookup_elem(&groups, &mgid); /* a clone invalidates nothing here, */
        if (!g)                                  /* but the verifier wants it fresh */
            break;
        struct ina_replica_key k = {.job = job_id, .rid = g->replicas[i].rid,
                                    .port = g->replicas[i].port};
        struct ina_dest *d = bpf_map_lookup_elem(&replicas, &k);
        if (!d) {
            if (last)
                return TC_ACT_SHOT;
            continue; /* no replicas entry: not a destination (pipeline._refresh_dests) */
        }
        if (chance(c->drop_eg)) {
            count(C_DROP_SIM_EGRESS);
            if (last)
                return TC_ACT_SHOT;
            continue;
        }
        count(C_RESULTS_SENT);
        int action = emit_one(skb, o, d->mac, d->ip, d->udp_port, k.port, last, c);
        if (last)
            return action;
    }
    return TC_ACT_SHOT;
}

/* The answer to a retransmission: back to its sender out of its ingress port. */
static __always_inline int emit_unicast(struct __sk_buff *skb, const struct origin *o,
                                        __u32 in_port, struct ina_cfg *c)
{
    if (chance(c->drop_eg))
        return drop(C_DROP_SIM_EGRESS);
    count(C_RESULTS_SENT);
    return emit_one(skb, o, o->src_mac, o->src_ip, o->src_port, in_port, 1, c);
}

/* The slot's partial sum to the upstream switch, as its worker `rank`. */
static __always_inline int emit_upward(struct __sk_buff *skb, const struct origin *o,
                                       struct ina_upstream *up, struct ina_cfg *c)
{
    void *data = (void *)(long)skb->data;
    void *end = (void *)(long)skb->data_end;
    struct ina_hdr *h = data + INA_OFF;
    if ((void *)(h + 1) > end)
        return TC_ACT_SHOT;
    h->vt = INA_VT_DATA;
    h->rank = (__u8)up->rank;
    if (chance(c->drop_eg))
        return drop(C_DROP_SIM_EGRESS);
    count(C_SENT_UPSTREAM);
    return emit_one(skb, o, up->mac, up->ip, up->udp_port, up->egress_port, 1, c);
}

#include "sharing.bpf.h" /* the shared region and the fallback (M_*, share_slot, ...) */

/* ------------------------------------------------------------------ the slot */
/* INA_NO_LOCK compiles the program without the slot lock: only for the test that shows
 * two CPUs updating one slot need it (tests/integration/test_ebpf_switch.py). */
#ifdef INA_NO_LOCK
#define slot_lock(s) ((void)(s))
#define slot_unlock(s) ((void)(s))
#else
#define slot_lock(s) bpf_spin_lock(&(s)->lock)
#define slot_unlock(s) bpf_spin_unlock(&(s)->lock)
#endif

enum verdict {
    V_STALE,
    V_DUPLICATE,
    V_AGGREGATED,  /* a contribution; the slot still waits for others */
    V_COMPLETED,   /* the last contribution: the payload now holds the result */
    V_ANSWER,      /* a retransmission of a finished use: payload = the stored result */
    V_RESEND_UP,   /* ... whose result has not come from upstream: the partial, again */
    V_TAKEN,       /* the upstream switch's result, stored: multicast it */
    V_FALLBACK,    /* a shared slot's retransmission: to the fallback (sharing.bpf.h) */
    V_FIRST = 8,   /* or'ed into V_AGGREGATED, V_COMPLETED: a shared slot's use started */
};

/* Lane loops, inside the slot's lock: no helper may be called there. Unrolled by 8:
 * rolled, clang reloaded the frame pointer from the stack for every lane (12 instructions
 * a lane in lanes_add); the kernel's test runner (emulation/softswitch/ebpf/microbench.py,
 * 4 workers) timed a 896-lane packet at 925 ns rolled and 672 unrolled, 64 lanes at 325
 * and 289 ns: 0.72 ns a lane before, 0.46 after. Unrolled by 16: no faster. */
static __always_inline void lanes_write(__s32 *values, __be32 *pkt)
{
#pragma clang loop unroll_count(8)
    for (int j = 0; j < INA_LANES; j++)
        values[j] = (__s32)bpf_ntohl(pkt[j]);
}

static __always_inline void lanes_add(__s32 *values, __be32 *pkt)
{
#pragma clang loop unroll_count(8)
    for (int j = 0; j < INA_LANES; j++)
        values[j] = (__s32)((__u32)values[j] + bpf_ntohl(pkt[j])); /* wrapping int32 */
}

static __always_inline void lanes_read(__s32 *values, __be32 *pkt)
{
#pragma clang loop unroll_count(8)
    for (int j = 0; j < INA_LANES; j++)
        pkt[j] = bpf_htonl((__u32)values[j]);
}

/* The last contribution: add, and the sum into the frame in the same pass (lanes_add
 * then lanes_read, one load of each register fewer). */
static __always_inline void lanes_add_read(__s32 *values, __be32 *pkt)
{
#pragma clang loop unroll_count(8)
    for (int j = 0; j < INA_LANES; j++) {
        __u32 sum = (__u32)values[j] + bpf_ntohl(pkt[j]); /* wrapping int32 */
        values[j] = (__s32)sum;
        pkt[j] = bpf_htonl(sum);
    }
}

/* Steps 1-4 of Pipeline.process for a DATA packet, under the lock: the verdict, and the
 * exponent the emitted packet carries. `mode`: M_*. */
static __always_inline __u32 slot_data(struct ina_slot *slot, __u32 set, __u32 rank,
                                       __u32 seq, __s32 exp, __u32 workers, __u32 mode,
                                       __be32 *pkt, __s32 *out_exp)
{
    __u32 v, first = 0;
    set &= 1;
    slot_lock(slot);
    struct ina_set *st = &slot->sets[set];
    __u32 left = st->remaining, stored = st->seq;
    if (seq == stored && (stored || left)) {
        if (left == 0) {
            /* Before the bitmaps: the sender's next use may have cleared its bit. */
            v = ((mode & M_UPSTREAM) && !st->final) ? V_RESEND_UP : V_ANSWER;
            lanes_read(slot->values[set], pkt);
            *out_exp = st->exponent;
            goto out;
        }
    } else if (stored && ((seq - stored) & 0x80000000)) {
        v = V_STALE; /* older than the use the slot holds */
        goto out;
    } else if (left || (mode & M_LOOSE)) { /* a use starts where another runs, or loose */
        v = (mode & M_RESEND_FB) ? V_FALLBACK : V_STALE; /* its use may be the fallback's */
        if (v == V_FALLBACK || !(mode & M_LOOSE))
            goto out;
        slot->bitmap[set] = 0; /* the uses before may have run at the other place */
        left = 0;
    }
    __u32 bit = 1U << (rank & 31);
    __u32 seen = slot->bitmap[set] & bit;
    slot->bitmap[set] |= bit;
    if (!(mode & M_LOOSE))
        slot->bitmap[set ^ 1] &= ~bit;
    if (seen) { /* counted already: a shared slot's retransmission goes to the fallback */
        v = (mode & M_RESEND_FB) ? V_FALLBACK : V_DUPLICATE;
        goto out;
    }
    if (left == 0) { /* first contribution: write, no clearing between uses */
        first = mode & M_SHARED ? V_FIRST : 0;
        left = workers - 1;
        st->seq = seq;
        st->final = 0;
        lanes_write(slot->values[set], pkt); /* a job of one: the frame is its result */
        st->exponent = exp;
    } else {
        left -= 1;
        if (left)
            lanes_add(slot->values[set], pkt);
        else
            lanes_add_read(slot->values[set], pkt); /* the frame now holds the result */
        if (exp > st->exponent)
            st->exponent = exp;
    }
    st->remaining = left;
    if (left) {
        v = V_AGGREGATED | first;
        goto out;
    }
    v = V_COMPLETED | first;
    *out_exp = st->exponent;
out:
    slot_unlock(slot);
    return v;
}

/* A RESULT from the upstream switch for a slot whose partial this switch sent up. */
static __always_inline enum verdict slot_result(struct ina_slot *slot, __u32 set, __u32 seq,
                                                __s32 exp, __be32 *pkt)
{
    enum verdict v;
    set &= 1;
    slot_lock(slot);
    struct ina_set *st = &slot->sets[set];
    if (seq != st->seq || seq == 0 || st->remaining) {
        v = V_STALE; /* not the use the slot holds, finished here */
    } else if (st->final) {
        v = V_DUPLICATE; /* another copy: the first was multicast */
    } else {
        lanes_write(slot->values[set], pkt);
        st->exponent = exp;
        st->final = 1;
        v = V_TAKEN;
    }
    slot_unlock(slot);
    return v;
}

/* ------------------------------------------------------------------ INA */
/* The datagram is what the UDP length says, as far as the frame holds it. */
static __always_inline __u32 datagram_len(struct __sk_buff *skb, struct udphdr *udp)
{
    __u32 n = bpf_ntohs(udp->len);
    n = n > UDP_BYTES ? n - UDP_BYTES : 0;
    __u32 avail = skb->len > INA_OFF ? skb->len - INA_OFF : 0;
    return n > avail ? avail : n;
}

static __noinline int ina(struct __sk_buff *skb, __u32 in_port, struct ina_cfg *c)
{
    count(C_RECEIVED);
    if (chance(c->drop_in))
        return drop(C_DROP_SIM_INGRESS);
    void *data = (void *)(long)skb->data;
    void *end = (void *)(long)skb->data_end;
    struct udphdr *udp = data + ETH_BYTES + IP_BYTES;
    if ((void *)(udp + 1) > end)
        return drop(C_DROP_TRUNCATED);
    __u32 n = datagram_len(skb, udp);
    if (n < INA_HEADER_SIZE)
        return drop(C_DROP_TRUNCATED);
    __u32 want = n == INA_HEADER_SIZE + INA_PAYLOAD_BYTES ? INA_FRAME : INA_OFF + INA_HEADER_SIZE;
    if (bpf_skb_pull_data(skb, want) < 0)
        return drop(C_DROP_TRUNCATED);
    data = (void *)(long)skb->data;
    end = (void *)(long)skb->data_end;
    struct ethhdr *eth = data;
    struct iphdr *ip = data + ETH_BYTES;
    udp = data + ETH_BYTES + IP_BYTES;
    struct ina_hdr *h = data + INA_OFF;
    if ((void *)(h + 1) > end)
        return drop(C_DROP_TRUNCATED);
    struct origin o;
    __builtin_memcpy(o.src_mac, eth->h_source, ETH_ALEN);
    __builtin_memcpy(o.own_mac, eth->h_dest, ETH_ALEN);
    o.src_ip = ip->saddr;
    o.own_ip = ip->daddr;
    o.src_port = udp->source;
    o.own_port = bpf_htons(INA_UDP_PORT);
    o.in_port = in_port;
    __u8 vt = h->vt;
    __u32 job_id = bpf_ntohs(h->job), rank = h->rank, lanes = bpf_ntohs(h->lanes);
    __u32 pidx = bpf_ntohs(h->pool_index), seq = bpf_ntohl(h->seq);
    __s32 exp = h->exponent;
    int from_upstream = 0;
    struct ina_upstream *up = NULL;
    struct ina_sharing *sh = c->sharing ? bpf_map_lookup_elem(&sharing, &job_id) : NULL;
    if (vt != INA_VT_DATA) {
        if (vt != INA_VT_RESULT)
            return drop(C_DROP_MALFORMED);
        if (sh && (sh->flags & SHARE_FALLBACK))
            return from_fallback(skb, &o, sh, job_id, lanes, n, c);
        up = bpf_map_lookup_elem(&upstream, &job_id);
        if (!up)
            return drop(C_DROP_MALFORMED); /* results never go to a switch, else */
        from_upstream = 1;
    }
    struct ina_job *job = bpf_map_lookup_elem(&jobs, &job_id);
    if (!job)
        return drop(C_DROP_UNKNOWN_JOB);
    if (from_upstream) {
        if (o.src_ip != up->ip || o.src_port != up->udp_port)
            return drop(C_DROP_BAD_SOURCE);
    } else {
        if (rank >= job->num_workers)
            return drop(C_DROP_BAD_RANK);
        struct ina_worker_key wk = {.ip = o.src_ip, .udp_port = o.src_port,
                                    .job = job_id, .rank = rank};
        if (!bpf_map_lookup_elem(&workers, &wk))
            return drop(C_DROP_BAD_SOURCE);
    }
    __u32 slot_rel = pidx & INA_SLOT_MASK;
    if (slot_rel >= job->slot_count &&
        (from_upstream || !sh || !(sh->flags & (SHARE_SHARED | SHARE_FALLBACK))))
        return drop(C_DROP_BAD_SLOT); /* past the reservation: shared, else the fallback's */
    if (lanes != INA_LANES)
        return drop(C_DROP_BAD_LANES);
    if (n != INA_HEADER_SIZE + INA_PAYLOAD_BYTES)
        return drop(C_DROP_BAD_LENGTH);
    __be32 *pkt = data + INA_OFF + INA_HEADER_SIZE;
    if ((void *)(pkt + INA_LANES) > end)
        return drop(C_DROP_BAD_LENGTH);
    __u32 index = job->slot_base + slot_rel, mode = 0;
    int place = from_upstream ? 0 /* the slot of a partial sum sent up: reserved */
                              : share_slot(sh, job, job_id, slot_rel, h->flags, &index, &mode);
    if (place)
        return place < 0 ? drop(C_DROP_BAD_SLOT) : to_fallback(skb, &o, job_id, c);
    struct ina_slot *slot = bpf_map_lookup_elem(&slots, &index);
    if (!slot)
        return drop(C_DROP_BAD_SLOT); /* a job entry outside the pool: no register */
    __u32 set = pidx & INA_POOL_SET_BIT ? 1 : 0;
    __s32 out_exp = exp;
    __u32 v;
    if (from_upstream) {
        v = slot_result(slot, set, seq, exp, pkt);
    } else {
        if (!up)
            up = bpf_map_lookup_elem(&upstream, &job_id);
        mode |= up ? M_UPSTREAM : 0;
        v = slot_data(slot, set, rank, seq, exp, job->num_workers, mode, pkt, &out_exp);
    }
    if (c->one_armed && !from_upstream)
        learn(&o); /* after the lane loops: a branch before them doubles the verifier's work */
    if (v & V_FIRST)
        count_shared_use(job_id);
    v &= ~V_FIRST;
    switch (v) {
    case V_FALLBACK:
        return to_fallback(skb, &o, job_id, c);
    case V_STALE:
        return drop(C_DROP_STALE);
    case V_DUPLICATE:
        count(C_DUPLICATES_IGNORED);
        return TC_ACT_SHOT;
    case V_AGGREGATED:
        count(C_AGGREGATED);
        return TC_ACT_SHOT;
    default:
        break;
    }
    h->exponent = (__s8)out_exp;
    if (v == V_TAKEN) {
        count(C_RESULTS_FROM_UPSTREAM);
        return emit_multicast(skb, &o, job_id, job, c);
    }
    h->vt = INA_VT_RESULT;
    if (v == V_ANSWER) {
        count(C_RETRANSMITS_ANSWERED);
        return emit_unicast(skb, &o, in_port, c);
    }
    if (v == V_RESEND_UP) {
        count(C_UPSTREAM_RESENT);
        return up ? emit_upward(skb, &o, up, c) : TC_ACT_SHOT;
    }
    count(C_AGGREGATED); /* V_COMPLETED */
    count(C_COMPLETED);
    if (up)
        return emit_upward(skb, &o, up, c);
    return emit_multicast(skb, &o, job_id, job, c);
}

#include "roce.bpf.h" /* its maps always; its code with INA_ROCE (`inalab switch --roce`) */

#include "forward.bpf.h" /* the forwarder: mac_key, flood, forward_frame */

/* ------------------------------------------------------------------ the classifier */
/* Whether the frame is INA (IPv4 without options, not a fragment, UDP to `port`:
 * INA_UDP_PORT, or ROCE_UDP_PORT) and, for a one-armed server (own_ip not 0), addressed
 * to it. */
static __always_inline int is_ina(struct __sk_buff *skb, __be32 own_ip, __u16 port)
{
    void *data = (void *)(long)skb->data;
    void *end = (void *)(long)skb->data_end;
    struct ethhdr *eth = data;
    struct iphdr *ip = data + ETH_BYTES;
    struct udphdr *udp = data + ETH_BYTES + IP_BYTES;
    if ((void *)(udp + 1) > end)
        return 0;
    return eth->h_proto == bpf_htons(ETH_P_IP) && *(__u8 *)ip == 0x45 &&
           ip->protocol == IPPROTO_UDP && !(ip->frag_off & bpf_htons(0x3FFF)) &&
           udp->dest == bpf_htons(port) && (!own_ip || ip->daddr == own_ip);
}

SEC("tc")
int ina_port(struct __sk_buff *skb)
{
    __u32 ifindex = skb->ifindex;
    __u32 *pp = bpf_map_lookup_elem(&ifports, &ifindex);
    if (!pp)
        return TC_ACT_OK; /* not a port of this switch */
    __u32 in_port = *pp;
    __u32 zero = 0;
    struct ina_cfg *c = bpf_map_lookup_elem(&cfg, &zero);
    struct ina_port *p = bpf_map_lookup_elem(&ports, &in_port);
    if (!c || !p)
        return TC_ACT_SHOT;
    count(C_FRAMES_IN);
    int copy = skb->mark == MARK_IN_DUP; /* its link has passed it */
    if (copy)
        skb->mark = 0;
    if ((p->link & 2) && !copy) {
        count_link(in_port, DIR_INGRESS, LINK_OFFERED);
        if (chance(p->loss_in)) {
            count_link(in_port, DIR_INGRESS, LINK_LOST);
            return TC_ACT_SHOT;
        }
        count_link(in_port, DIR_INGRESS, LINK_DELIVERED);
        if (chance(p->dup_in)) { /* at the back of the queue: after what came in meanwhile */
            count_link(in_port, DIR_INGRESS, LINK_DUPLICATED);
            skb->mark = MARK_IN_DUP;
            bpf_clone_redirect(skb, skb->ifindex, BPF_F_INGRESS);
            skb->mark = 0;
        }
    }
    /* The headers linear, whatever the device gave (a short frame pulls what it has). */
    __u32 head = skb->len < INA_OFF ? skb->len : INA_OFF;
    if (bpf_skb_pull_data(skb, head) < 0)
        return TC_ACT_SHOT;
    __be32 own_ip = c->one_armed ? c->own_ip : 0;
    if (c->one_armed || !c->forward_only) {
        if (is_ina(skb, own_ip, INA_UDP_PORT))
            return ina(skb, in_port, c);
#ifdef INA_ROCE
        if (is_ina(skb, own_ip, ROCE_UDP_PORT))
            return roce(skb, in_port, c);
#endif
    }
    if (c->one_armed) { /* a host's NIC: what is not INA for it is the host's */
        count(C_PASSED_TO_HOST);
        return TC_ACT_OK;
    }
    return forward_frame(skb, in_port, c);
}
