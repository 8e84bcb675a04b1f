/* tna/sharing.p4: TnaSharing, the tables of a best-effort shared region of the pool and
 * of a fallback aggregator on a server (../sharing.p4's: the same names, ids, keys,
 * actions and parameters, so the controller writes both programs alike; docs/sharing.md),
 * and TnaOwner, the owner register.
 *
 * The tables give a job's region (shared), its fallback's address (fallback; its action
 * also XORs that address with the packet's source, as upstream.p4's does, for checks.p4)
 * and whether this switch is a fallback behind another (behind).
 *
 * A shared slot takes two passes (the owner register's stage comes after the seq's):
 *   - pass 1 (checks.p4's place): the pool slot, cell = base + ((offset + t) & mask) for
 *     t = slot - slot_count (ina_tna.p4 computes it, a step a stage), and its owner
 *     cell: taken if free, held by this job slot, or held by another (a collision); or
 *     t past the shared count. The packet is resubmitted with the cell and that verdict
 *     (resubmit_h);
 *   - pass 2 (resubmit_data.shared): seq.p4 and the slot's registers at the cell. A
 *     collision, or a slot past the count, goes on to the fallback (checks.p4); a
 *     retransmission that would start a use there, or that the slot counted already,
 *     too; a newer use takes the slot over (checks.p4's restart).
 * Tofino 1 resubmits a packet once: a shared slot's use starts in its pass 2 (the seq
 * advances without the peek a reserved slot's first packet takes, since a newer use takes
 * a loose slot over anyway).
 * Reference: emulation/softswitch/sharing.py, pipeline.py; ../sharing.p4.
 */
#ifndef _INA_TNA_SHARING_P4_
#define _INA_TNA_SHARING_P4_

control TnaSharing(in tna_headers_t hdr, inout tna_ingress_metadata_t meta) {
    @id(0x01100001) @name(".Ingress.sharing.set_shared")
    action set_shared(bit<16> count, bit<16> base, bit<16> mask, bit<16> offset,
                      bit<16> stats) {
        meta.has_shared = 1;
        meta.shared_count = count;
        meta.shared_base = base;
        meta.shared_mask = mask;
        meta.shared_offset = offset;
        meta.shared_stats = stats;
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
                        PortId_t egress_port, bit<16> stats) {
        meta.has_fallback = 1;
        meta.fallback_ip = dst_ip;
        meta.fallback_udp_port = dst_port;
        meta.fallback_mac = dst_mac;
        meta.fallback_port = egress_port;
        meta.fallback_stats = stats;
        meta.fallback_ip_diff = dst_ip ^ hdr.ipv4.src_addr;
        meta.fallback_port_diff = dst_port ^ hdr.udp.src_port;
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

// One cell per pool slot, for both sets (the pair of sets is what a job slot holds):
// 0 while free, else (job << 16) | (slot + 1) of the job slot that took it.
control TnaOwner(inout tna_ingress_metadata_t meta) {
    @name(".Ingress.sharing.owner")
    Register<bit<32>, tna_cell_t>(TNA_SWITCH_SLOTS, 0) owner;

    // held: 0 free (now this job slot's) or this job slot's; 1 another's (a collision).
    RegisterAction<bit<32>, tna_cell_t, bit<8>>(owner) take = {
        void apply(inout bit<32> value, out bit<8> held) {
            if (value == 0) {
                value = meta.owner_me;
            } else if (value != meta.owner_me) {
                held = 1;
            }
        }
    };

    Hash<tna_cell_t>(HashAlgorithm_t.IDENTITY) cell;

    apply {
        meta.resubmit_data.held = take.execute(cell.get({meta.cell[12:0]}));
    }
}

#endif  // _INA_TNA_SHARING_P4_
