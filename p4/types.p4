/* types.p4: typedefs and the metadata every control reads and writes.
 *
 * bmv2 zero-fills user metadata when a packet arrives and copies it into every
 * multicast replica, so egress sees what ingress decided (result, multicast).
 */
#ifndef _INA_TYPES_P4_
#define _INA_TYPES_P4_

typedef bit<48> mac_addr_t;
typedef bit<32> ipv4_addr_t;
typedef bit<16> l4_port_t;
typedef bit<9> port_t;        // v1model port numbers
typedef bit<16> mcast_group_t;
typedef bit<16> replica_id_t;

struct metadata_t {
    // Set by the parser: UDP destination port is INA_UDP_PORT, or ROCE_UDP_PORT (is_roce
    // too: roce.p4 makes the INA header from the RoCEv2 one).
    bit<1> is_ina;
    bit<1> is_roce;
    // Set by the parser from the BTH opcode: one INA sends (a UC WRITE), the first packet
    // of a message (a RETH follows), one with immediate, the last packet of a message.
    bit<1> roce_opcode_ok;
    bit<1> roce_first;
    bit<1> roce_imm;
    bit<1> roce_last;
    // From roce.p4's tables: the queue pair's job and rank, the job's messages of
    // 2^roce_shift packets; in egress, the reply's rank and window position.
    bit<16> roce_job;
    bit<8> roce_rank;
    bit<8> roce_shift;
    bit<8> reply_rank;
    bit<16> roce_position;
    // NO_DROP, or the drops counter index of why the packet is dropped.
    bit<32> drop_reason;

    // From the jobs table (set_job), widened to bit<32> for the arithmetic.
    bit<32> num_workers;
    bit<32> slot_base;
    bit<32> slot_count;
    mcast_group_t mgid;

    // From the upstream table (set_upstream): the job's partial sums go to the upstream
    // switch as rank upstream_rank, to this address, out of upstream_port.
    bit<1> has_upstream;
    bit<8> upstream_rank;
    ipv4_addr_t upstream_ip;
    l4_port_t upstream_udp_port;
    mac_addr_t upstream_mac;
    port_t upstream_port;
    bit<1> from_upstream; // a RESULT of a job with an upstream entry: the spine's answer

    // From sharing.p4's tables. shared: the job's slots slot_count .. slot_count +
    // shared_count - 1 lie in a shared region, job slot slot_count + t at pool slot
    // shared_base + ((shared_offset + t) & shared_mask). fallback: the job's fallback
    // aggregator's address and the port toward it. *_stats: the job's cell of sharing's
    // counters (fallback_stats also in egress: to_fallback). behind: this switch is the
    // fallback of the job (every slot loose).
    bit<1> has_shared;
    bit<32> shared_count;
    bit<32> shared_base;
    bit<32> shared_mask;
    bit<32> shared_offset;
    bit<32> shared_stats;
    bit<1> has_fallback;
    ipv4_addr_t fallback_ip;
    l4_port_t fallback_udp_port;
    mac_addr_t fallback_mac;
    port_t fallback_port;
    bit<32> fallback_stats;
    bit<1> is_behind;
    bit<1> from_fallback; // a RESULT of a job with a fallback entry: the fallback's

    // The packet's slot: absolute slot in the pool (bitmap index) and register index
    // of its (set, slot): pool_set * SWITCH_SLOTS + slot.
    bit<32> slot;
    bit<32> index;
    bit<32> worker_bit;   // 1 << rank
    bit<1> in_reservation; // hdr.ina.slot < slot_count (else shared or the fallback's)
    bit<1> loose;         // a slot whose uses may also run at another place (sharing.p4)

    // The use the (set, slot) holds, read before the bitmaps (see ina.p4).
    bit<32> stored_seq;
    bit<32> remaining;    // read value, then the value to write back
    bit<1> is_final;      // the slot holds the upstream switch's result (Ingress.final)

    // Decisions.
    bit<1> answer;        // retransmission of a finished use: unicast the result back
    bit<1> resend_up;     // ... whose result has not come from upstream: send up again
    bit<1> restart;       // a new use takes a loose slot: this set's bitmap starts at 0
    bit<1> seen;          // this worker's bit was already set: duplicate
    bit<1> first;         // first contribution of a new use: write, not add
    bit<1> complete;      // the counter reached 0: multicast the result
    bit<2> lane_op;       // LANE_OP_*: what exponents.p4 and values.p4 do
    bit<1> send_up;       // the partial sum goes to the upstream switch (unicast DATA)
    bit<1> take_result;   // the upstream's first RESULT for the slot: store, multicast

    // Carried to egress.
    bit<1> result;        // leaves as a RESULT (multicast or unicast re-send)
    bit<1> upward;        // leaves as DATA to the upstream switch (a partial sum)
    bit<1> to_fallback;   // leaves as DATA, unchanged, to the job's fallback aggregator
    bit<1> multicast;     // a replica of the job's group: replicas.p4 sets its destination
    bit<1> no_replica;    // replicas table miss: dropped, not counted
    bit<1> flooded;       // ordinary traffic flooded by forwarder.p4: not back out its port
}

#endif  // _INA_TYPES_P4_
