/* sharing.bpf.h: the shared region and the fallback aggregator of ina.bpf.c (included by
 * it, before the slot code): docs/sharing.md. The reference is the soft switch's
 * emulation/softswitch/sharing.py (Sharing.place) and pipeline.py (Pipeline._process,
 * _to_fallback, _from_fallback); the P4 program's is p4/sharing.p4.
 *
 * - A DATA packet of a slot past its job's reservation finds its pool slot in the shared
 *   region (share_place: the owner cell taken if free), or goes unchanged to the job's
 *   fallback aggregator (to_fallback): a collision, a slot past the shared count;
 * - slots whose uses may also run at the other place are loose (M_LOOSE: a shared slot,
 *   every slot of a job served behind a switch); slot_data then lets a newer use take the
 *   slot over, starts each use with a clear bitmap and leaves the other set's alone, and
 *   passes a shared slot's retransmission that would start a use, or that it counted
 *   already, to the fallback (M_RESEND_FB, V_FALLBACK);
 * - a RESULT from the job's fallback address is multicast unchanged (from_fallback).
 *
 * One-armed (a reduction server), the program is the fallback aggregator of the jobs in
 * the behind table: their ranks are all bound to the front switch's address, which
 * passes their packets on from its own, and their results go back there, so nothing
 * here but the loose slots is particular to them.
 */

/* slot_data's mode (ina.bpf.c): the job has an upstream switch; the slot is loose, in the
 * shared region, and a retransmission there that the switch cannot answer goes to the
 * job's fallback. */
#define M_UPSTREAM 1
#define M_LOOSE 2
#define M_SHARED 4
#define M_RESEND_FB 8

/* The job's entries of the three tables (shared, fallback, behind), in one value whose
 * flags say which exist: the tables share their key, a DATA packet needs the behind flag
 * and, past its reservation, the other two, so one lookup finds what a packet needs
 * (none while cfg.sharing is 0: no job has any). */
struct {
    __uint(type, BPF_MAP_TYPE_HASH);
    __uint(max_entries, 1024);
    __type(key, __u32);
    __type(value, struct ina_sharing);
} sharing SEC(".maps");

/* The owner register, per pool slot (both sets): 0, or job << 16 | (slot + 1) of the job
 * slot that holds it. max_entries is set to the pool's slots per set before loading. A
 * map of its own rather than a field of the slot, so that clearing a slot (a new job's
 * range, clear_slots) leaves its owner alone, as the pipeline's does; a free cell is
 * taken by compare-and-swap, so two CPUs never both take it. */
struct {
    __uint(type, BPF_MAP_TYPE_ARRAY);
    __uint(max_entries, 1);
    __type(key, __u32);
    __type(value, __u32);
} owner SEC(".maps");

/* The per-job counters of sharing (JS_*), per CPU, in cells the job's entries name
 * (sharing.py's stats: the shared entry's counts shared uses and collisions, the fallback
 * entry's the packets to and the results from the fallback), as p4/sharing.p4's are. */
struct {
    __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
    __uint(max_entries, INA_STATS_CELLS);
    __type(key, __u32);
    __type(value, struct ina_job_stats);
} share_stats SEC(".maps");

static __always_inline void stat_add(__u32 cell, __u32 what)
{
    __u64 *s = bpf_map_lookup_elem(&share_stats, &cell);
    if (s)
        s[what & 3] += 1;
}

/* A use started in the shared region: the job's shared_uses. */
static __always_inline void count_shared_use(__u32 job_id)
{
    struct ina_sharing *sh = bpf_map_lookup_elem(&sharing, &job_id);
    if (sh)
        stat_add(sh->stats, JS_SHARED_USES);
}

/* The pool slot of job slot `slot` (past the job's `reserved` ones) in the shared region,
 * its owner cell taken if free (Sharing.place); -1 without a shared entry or past its
 * count, -2 on a collision (counted), -3 for a region outside the pool (EbpfDataplane
 * refuses one). */
static __always_inline __s32 share_place(const struct ina_sharing *sh, __u32 job_id,
                                         __u32 slot, __u32 reserved)
{
    __u32 t = slot - reserved;
    if (!(sh->flags & SHARE_SHARED) || t >= sh->count)
        return -1;
    __u32 x = sh->base + ((sh->offset + t) & sh->mask);
    __u32 *cell = bpf_map_lookup_elem(&owner, &x);
    if (!cell)
        return -3;
    __u32 me = job_id << 16 | (slot + 1);
    __u32 held = *(volatile __u32 *)cell;
    if (held == 0) /* free: take it, unless another CPU has just done so */
        held = __sync_val_compare_and_swap(cell, 0, me);
    if (held && held != me) {
        stat_add(sh->stats, JS_COLLISIONS);
        return -2;
    }
    return (__s32)x;
}

static __always_inline int mac_unset(const __u8 *m)
{
    return !(m[0] | m[1] | m[2] | m[3] | m[4] | m[5]);
}

/* A DATA packet this switch does not aggregate (Pipeline._to_fallback): unchanged, INA
 * header and lanes, to the job's fallback aggregator, from the switch's INA address as a
 * partial sum goes upstream (emit_upward), after the egress drop simulator; without a
 * fallback entry, bad_slot. One-armed, to the next hop as every answer goes; where that is
 * unknown, to the entry's MAC: the fallback sends nothing before the first packet it gets;
 * and the sender's MAC learned, for the fallback's results. */
static __always_inline int to_fallback(struct __sk_buff *skb, const struct origin *o,
                                       __u32 job_id, struct ina_cfg *c)
{
    if (c->one_armed)
        learn(o);
    struct ina_sharing *sh = bpf_map_lookup_elem(&sharing, &job_id);
    if (!sh || !(sh->flags & SHARE_FALLBACK))
        return drop(C_DROP_BAD_SLOT);
    if (chance(c->drop_eg))
        return drop(C_DROP_SIM_EGRESS);
    stat_add(sh->fb_stats, JS_TO_FALLBACK);
    __u8 hop[ETH_ALEN];
    const __u8 *mac = sh->mac;
    __u32 port = sh->egress_port;
    if (c->one_armed) {
        if (next_hop(skb, o->own_ip, sh->ip, sh->udp_port, hop) == 0) {
            mac = hop;
        } else if (mac_unset(sh->mac)) {
            count(C_NO_ROUTE);
            return TC_ACT_SHOT;
        }
        port = o->in_port;
    }
    struct ina_port *p;
    __u32 ifindex = port_ifindex(port, &p);
    if (!ifindex || !p)
        return TC_ACT_SHOT;
    if (rewrite(skb, mac, o->own_mac, o->own_ip, sh->ip, o->own_port, sh->udp_port) < 0)
        return TC_ACT_SHOT;
    return send_out(skb, port, ifindex, p, 1);
}

/* A RESULT of a job with a fallback entry (Pipeline._from_fallback): from the fallback's
 * address, multicast unchanged to the job's workers as a completed slot's result is; no
 * register is touched. */
static __always_inline int from_fallback(struct __sk_buff *skb, const struct origin *o,
                                         const struct ina_sharing *sh, __u32 job_id,
                                         __u32 lanes, __u32 n, struct ina_cfg *c)
{
    struct ina_job *job = bpf_map_lookup_elem(&jobs, &job_id);
    if (!job)
        return drop(C_DROP_UNKNOWN_JOB);
    if (o->src_ip != sh->ip || o->src_port != sh->udp_port)
        return drop(C_DROP_BAD_SOURCE);
    if (lanes != INA_LANES)
        return drop(C_DROP_BAD_LANES);
    if (n != INA_HEADER_SIZE + INA_PAYLOAD_BYTES)
        return drop(C_DROP_BAD_LENGTH);
    stat_add(sh->fb_stats, JS_FROM_FALLBACK);
    if (c->one_armed)
        learn(o); /* where the next packet passed on goes */
    return emit_multicast(skb, o, job_id, job, c);
}

/* A DATA packet's way through the sharing tables to its slot (Pipeline._process): 0 and
 * the pool slot in *index, the slot's mode (M_*) in *mode; 1: the packet goes to the
 * fallback (to_fallback); -1: bad_slot. `sh`: the job's entries, if any. */
static __always_inline int share_slot(const struct ina_sharing *sh, const struct ina_job *job,
                                      __u32 job_id, __u32 slot_rel, __u32 flags, __u32 *index,
                                      __u32 *mode)
{
    if (slot_rel < job->slot_count) {
        *mode = sh && (sh->flags & SHARE_BEHIND) ? M_LOOSE : 0;
        return 0;
    }
    if (!sh)
        return -1;
    __s32 x = share_place(sh, job_id, slot_rel, job->slot_count);
    if (x == -3)
        return -1;
    if (x < 0)
        return 1;
    *index = (__u32)x;
    *mode = M_LOOSE | M_SHARED;
    if ((flags & INA_FLAG_RESEND) && (sh->flags & SHARE_FALLBACK))
        *mode |= M_RESEND_FB;
    return 0;
}
