/* sharing.p4: SharingIngress, the tables of a best-effort shared region of the pool and
 * of a fallback aggregator on a server, with the owner register and the per-job counters
 * of sharing (docs/sharing.md; issue #41).
 *
 * Three tables, keyed by job id, applied once to every INA packet past the version check:
 *   - shared: job slot slot_count + t (t < count) is aggregated in pool slot
 *     base + ((offset + t) & mask), in a region of mask + 1 slots (a power of two) that
 *     jobs share;
 *   - fallback: the job's fallback aggregator (INA address, MAC, egress port): a DATA
 *     packet the switch cannot aggregate goes there unchanged, and its RESULTs come back
 *     here to be multicast to the job's workers (from_fallback);
 *   - behind: on a fallback aggregator, the jobs it serves behind a switch, whose slots
 *     are all loose (below).
 * The owner register holds, per pool slot (both sets), 0 while the slot is free, else
 * (job << 16) | (slot + 1) of the job slot that took it; a job slot keeps it until its
 * job is removed (the controller then clears the slot and the cell). ina.p4 reads it for
 * a slot past the job's reservation: a packet that finds its cell held by another job
 * slot is a collision and goes to the fallback, as does a slot past the shared count;
 * without a fallback entry either is DROP_BAD_SLOT.
 *
 * A slot past the job's reservation, or any slot of a job in the behind table, is loose:
 * its uses may also run at the other place, so seq_check.p4 lets a newer use take over a
 * slot in progress and starts every use with a clear bitmap, and bitmap.p4 leaves the
 * other set's bitmap alone. A retransmission (FLAG_RESEND) of a shared slot that would
 * start a use, or that the slot has counted already, goes to the fallback: its use may
 * have run, or finished, there.
 *
 * Per-job counters, in the job's cell that its entries name (stats: the shared entry's
 * for shared_uses, a use's first contribution in a shared slot, and collisions; the
 * fallback entry's for from_fallback, the fallback's RESULTs multicast, and, in egress,
 * to_fallback, DATA packets that leave toward the fallback, after the egress drop
 * simulator, as sent_upstream is counted).
 * Reference: emulation/softswitch/sharing.py (Sharing.place) and pipeline.py
 * (Pipeline._process, _to_fallback, _from_fallback).
 * Controller: controller/sharing.py.
 */
#ifndef _INA_SHARING_P4_
#define _INA_SHARING_P4_

// The owner register and the per-job counters are declared at the top level, not in
// SharingIngress: ina.p4 needs them at points apart in the pipeline (the owner before
// the seq check, shared_uses after the bitmaps, to_fallback in egress), and a control
// is applied at one point (p4c copies its parameters at a second call site, and the
// copy of the user metadata breaks the bmv2 JSON: p4/README.md).

// One cell per pool slot, for both sets: the pair of sets is the unit a job slot holds
// (SwitchML's shadow copy keeps both busy while the job runs).
@id(0x16100001) @name(".Ingress.sharing.owner")
register<bit<32>>(SWITCH_SLOTS) owner;

// Each job's cell is the controller's choice, named by its entries (the stats parameter):
// the shared entry's for shared_uses and collisions, the fallback entry's for
// to_fallback and from_fallback.
@id(0x12100001) @name(".Ingress.sharing.shared_uses")
counter(SHARING_STATS_SIZE, CounterType.packets) shared_uses;
@id(0x12100002) @name(".Ingress.sharing.collisions")
counter(SHARING_STATS_SIZE, CounterType.packets) collisions;
@id(0x12100003) @name(".Ingress.sharing.from_fallback")
counter(SHARING_STATS_SIZE, CounterType.packets) from_fallback;
@id(0x12100004) @name(".Egress.sharing.to_fallback")
counter(SHARING_STATS_SIZE, CounterType.packets) to_fallback;

control SharingIngress(in headers_t hdr, inout metadata_t meta) {
    @id(0x01100001) @name(".Ingress.sharing.set_shared")
    action set_shared(bit<16> count, bit<16> base, bit<16> mask, bit<16> offset,
                      bit<16> stats) {
        meta.has_shared = 1;
        meta.shared_count = (bit<32>)count;
        meta.shared_base = (bit<32>)base;
        meta.shared_mask = (bit<32>)mask;
        meta.shared_offset = (bit<32>)offset;
        meta.shared_stats = (bit<32>)stats;
    }

    @id(0x01100002) @name(".Ingress.sharing.shared_miss")
    action shared_miss() {
        meta.has_shared = 0;
    }

    @id(0x02100001) @name(".Ingress.sharing.shared")
    table shared {
        key = {
            hdr.ina.job_id: exact @name("job_id");
        }
        actions = {
            set_shared;
            @defaultonly shared_miss;
        }
        const default_action = shared_miss();
        size = SHARED_TABLE_SIZE;
    }

    @id(0x01100003) @name(".Ingress.sharing.set_fallback")
    action set_fallback(ipv4_addr_t dst_ip, l4_port_t dst_port, mac_addr_t dst_mac,
                        port_t egress_port, bit<16> stats) {
        meta.has_fallback = 1;
        meta.fallback_stats = (bit<32>)stats;
        meta.fallback_ip = dst_ip;
        meta.fallback_udp_port = dst_port;
        meta.fallback_mac = dst_mac;
        meta.fallback_port = egress_port;
    }

    @id(0x01100004) @name(".Ingress.sharing.fallback_miss")
    action fallback_miss() {
        meta.has_fallback = 0;
    }

    @id(0x02100002) @name(".Ingress.sharing.fallback")
    table fallback {
        key = {
            hdr.ina.job_id: exact @name("job_id");
        }
        actions = {
            set_fallback;
            @defaultonly fallback_miss;
        }
        const default_action = fallback_miss();
        size = FALLBACK_TABLE_SIZE;
    }

    @id(0x01100005) @name(".Ingress.sharing.set_behind")
    action set_behind() {
        meta.is_behind = 1;
    }

    @id(0x01100006) @name(".Ingress.sharing.behind_miss")
    action behind_miss() {
        meta.is_behind = 0;
    }

    @id(0x02100003) @name(".Ingress.sharing.behind")
    table behind {
        key = {
            hdr.ina.job_id: exact @name("job_id");
        }
        actions = {
            set_behind;
            @defaultonly behind_miss;
        }
        const default_action = behind_miss();
        size = BEHIND_TABLE_SIZE;
    }

    apply {
        shared.apply();
        fallback.apply();
        behind.apply();
    }
}

#endif  // _INA_SHARING_P4_
