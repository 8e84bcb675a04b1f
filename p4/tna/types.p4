/* tna/types.p4: the metadata of the TNA program, and what passes between its passes.
 *
 * @pa_auto_init_metadata (ina_tna.p4) zeroes ingress metadata, as bmv2 does.
 */
#ifndef _INA_TNA_TYPES_P4_
#define _INA_TNA_TYPES_P4_

// Ingress to egress: what ingress decided, prepended to the packet (the deparser emits
// it, the egress parser takes it off).
header bridge_h {
    bit<1> result;        // leaves as a RESULT (multicast or unicast re-send)
    bit<1> upward;        // leaves as DATA to the upstream switch
    bit<1> multicast;     // a replica of the job's group: replicas.p4 addresses it
    bit<1> flooded;       // ordinary traffic flooded: not back out of its ingress port
    bit<3> pad0;
    PortId_t ingress_port;
}

// Pass 1 to pass 2 (Tofino 1's resubmit data is 64 bits).
header resubmit_h {
    bit<8> pass;
    bit<56> pad;
}

struct tna_ingress_metadata_t {
    resubmit_h resubmit_data;
    bit<1> is_ina;        // UDP to INA_UDP_PORT (the parser)
    bit<1> second_pass;   // resubmitted: the seq advances (seq.p4)

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
}

struct tna_egress_metadata_t {
    tna_draw_t draw;
    bit<8> sim_drop;
    bit<1> no_replica;
}

#endif  // _INA_TNA_TYPES_P4_
