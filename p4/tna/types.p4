/* tna/types.p4: the metadata of the TNA program, and what passes between its passes.
 *
 * @pa_auto_init_metadata (ina_tna.p4) zeroes ingress metadata, as bmv2 does.
 */
#ifndef _INA_TNA_TYPES_P4_
#define _INA_TNA_TYPES_P4_

// A RoCEv2 queue pair register's index (ROCE_QP_REGISTERS cells).
typedef bit<14> roce_qp_index_t;

// A pool slot, for both sets: the owner register's index (sharing.p4).
typedef bit<13> tna_cell_t;

// Ingress to egress: what ingress decided, prepended to the packet (the deparser emits
// it, the egress parser takes it off).
header bridge_h {
    bit<1> result;        // leaves as a RESULT (multicast or unicast re-send)
    bit<1> upward;        // leaves as DATA to the upstream switch
    bit<1> multicast;     // a replica of the job's group: replicas.p4 addresses it
    bit<1> flooded;       // ordinary traffic flooded: not back out of its ingress port
    bit<1> roce;          // arrived as RoCEv2: egress makes each result a WRITE (roce_replies.p4)
    bit<1> fallback;      // DATA passed on to the job's fallback (with upward: sharing.p4)
    bit<1> pad0;
    PortId_t ingress_port;
    bit<8> roce_shift;    // the job's log2(packets per message) (roce_jobs)
    bit<16> fallback_stats;   // the job's cell of the to_fallback counter
}

// Pass 1 to pass 2 (Tofino 1's resubmit data is 64 bits).
header resubmit_h {
    bit<8> pass;
    bit<1> shared;        // a shared slot's pass 1 placed it (sharing.p4): ...
    bit<1> check;         // ... a retransmission with a fallback: seq is only checked ...
    bit<6> pad0;
    bit<16> cell;         // ... in this pool slot, ...
    bit<8> held;          // ... 0: this job slot's, 1: another's, 2: past the shared count
    bit<24> pad;
}

struct tna_ingress_metadata_t {
    resubmit_h resubmit_data;
    bit<1> is_ina;        // UDP to INA_UDP_PORT (the parser)
    bit<1> second_pass;   // resubmitted: the seq advances (seq.p4)
    bit<1> shared_pass;   // ... a shared slot's, at resubmit_data.cell (sharing.p4) ...
    bit<1> shared_check;  // ... a retransmission's: its seq is checked, never advanced

    // Checks of header fields against constants (ina_tna.p4), keys of checks.p4.
    bit<1> version_ok;
    bit<1> is_data;
    bit<1> is_result;
    bit<1> lanes_ok;
    bit<1> length_ok;

    // jobs.p4
    bit<1> job_hit;
    bit<8> num_workers;
    mcast_group_t mgid;
    bit<16> abs_slot;     // slot_base + pool_index: bit 15 the set, 0-12 the slot in the pool
    bit<16> slot_count;
    bit<16> slot;         // pool_index without the set bit
    bit<16> slot_diff;    // slot - slot_count: bit 15 clear when the slot is out of range
    // workers.p4
    bit<1> worker_hit;
    // masks.p4: the sender's bit and the job's other workers' bits
    bit<1> rank_ok;
    bit<32> not_bit;      // ~(1 << rank)
    bit<32> others;       // (1 << workers) - 1 without the sender's bit
    // upstream.p4
    bit<1> has_upstream;
    bit<8> upstream_rank;
    ipv4_addr_t upstream_ip;
    l4_port_t upstream_udp_port;
    mac_addr_t upstream_mac;
    PortId_t upstream_port;
    bit<32> upstream_ip_diff;     // 0: the packet comes from the upstream switch's address
    bit<16> upstream_port_diff;
    // sharing.p4: the shared entry, ...
    bit<1> has_shared;
    bit<16> shared_count;
    bit<16> shared_base;
    bit<16> shared_mask;
    bit<16> shared_offset;
    bit<16> shared_stats;
    // ... the pool slot of a slot past the reservation (ina_tna.p4, a step a stage) ...
    bit<16> shared_rel;   // slot_diff + offset
    bit<16> shared_wrap;  // shared_rel & mask
    bit<16> shared_left;  // slot_diff - count: bit 15 set while in the shared count
    bit<16> slot_next;    // slot + 1
    bit<32> owner_me;     // job_id ++ slot_next: the owner cell's value for this job slot
    // ... the fallback entry (0 differences: the packet comes from its address) ...
    bit<1> has_fallback;
    ipv4_addr_t fallback_ip;
    l4_port_t fallback_udp_port;
    mac_addr_t fallback_mac;
    PortId_t fallback_port;
    bit<16> fallback_stats;
    bit<32> fallback_ip_diff;
    bit<16> fallback_port_diff;
    // ... the behind entry, and what checks.p4 and next_step.p4 decided of it
    bit<1> is_behind;
    bit<1> place;         // pass 1 of a shared slot: take the owner cell, resubmit
    bit<1> to_fallback;   // pass the DATA packet on, unchanged, to the fallback
    bit<1> from_fallback; // the fallback's RESULT: multicast
    bit<1> collision;     // the cell is another job slot's
    bit<1> shared_use;    // a use's first contribution in a shared slot
    bit<16> cell;         // shared_wrap | base: the pool slot (resubmit_data.cell)
    bit<1> resend_join;   // a retransmission in a shared slot with a fallback: if counted
                          // already, it goes on to the fallback (next_step.p4)

    // drop_simulator.p4
    tna_draw_t draw;
    bit<8> sim_drop;

    // seq.p4: 0 the slot's use, 1..2^31-1 a newer use (or an unused slot), else older
    bit<32> seq_diff;

    // checks.p4 and next_step.p4
    bit<8> drop_reason;
    bit<3> mode;
    bit<32> missing;      // the slot's missing workers before this packet
    bit<8> lane_op;       // LANE_OP_* (8 bits: final_take's output is one)
    bit<8> stat;          // the ina_stats counter this packet counts
    bit<1> complete;
    bit<1> answer;        // a finished use's retransmission: unicast the result back
    bit<1> resubmit;
    bit<1> take_result;   // the upstream's RESULT: multicast unless the slot was final
    bit<8> was_final;     // the final register before this packet (answer_upstream)
    tna_index_t index;    // the (set, slot) register index: {pool_set, abs_slot[12:0]}

    // roce.p4 (RoCEv2 requests): the parser's opcode flags and expected UDP length ...
    bit<1> is_roce;
    bit<1> roce_opcode_ok;
    bit<1> roce_first;
    bit<1> roce_last;
    bit<1> roce_imm;
    bit<1> roce_len_ok;       // the UDP length the opcode's headers and the lanes make
    bit<1> roce_short;        // no BTH, or a UDP length below BTH and ICRC
    bit<1> roce_missing;      // the opcode's RETH or ImmDt is missing
    bit<1> roce_qp_miss;
    bit<1> roce_job_miss;
    bit<1> roce_bad_source;
    // ... roce_requests and roce_jobs ...
    bit<16> roce_job;
    bit<8> roce_rank;
    roce_qp_index_t roce_reg;
    bit<1> roce_dropped;      // a RoCEv2 check failed: roce_reason (ina_tna.p4 counts it
    bit<8> roce_reason;       // unless the drop simulator dropped the packet first)
    bit<32> roce_src_diff;    // ipv4 source ^ the queue pair's worker: 0 if it sent it
    bit<8> roce_shift;
    // ... roce_shapes (a FIRST's checks) and the queue pair's step
    bit<1> roce_first_bad;    // a FIRST the shapes refused, for roce_first_reason
    bit<8> roce_first_reason;
    bit<16> roce_mask;        // packets per message - 1
    bit<32> roce_psn_open;    // psn ++ ROCE_QP_OPEN: what expect_psn holds for this packet
    bit<32> roce_next_open;   // (psn + 1) ++ ROCE_QP_OPEN: expect_psn if the packet ...
    bit<1> roce_opens;        // ... leaves the message open (not its last, length right)
    bit<8> roce_psn_ok;       // expect_psn's verdict (1: in sequence)
    bit<8> roce_over;         // place's verdict (1: beyond the message's packets)
}

struct tna_egress_metadata_t {
    tna_draw_t draw;
    bit<8> sim_drop;
    bit<1> no_replica;
    // roce_replies.p4
    bit<8> reply_rank;
    bit<16> roce_position;
    bit<32> roce_dma_length;
    roce_qp_index_t psn_reg;
    bit<32> psn;
    bit<32> roce_psn_offset;   // (seq << ROCE_PSN_SEQ_SHIFT) + place
    bit<1> roce_first;
    bit<1> roce_last;
}

#endif  // _INA_TNA_TYPES_P4_
