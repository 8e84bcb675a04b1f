/* roce_replies.p4: RoceEgress, each result that leaves for a RoCEv2 worker made a UC RDMA
 * WRITE to the worker's queue pair (roce.p4 made the INA packet it started as).
 *
 * The key (job, rank, window position) names one worker queue pair: a multicast
 * replica's rank is its rid (replicas.p4 set its addresses), a unicast answer's the
 * sender's. Its entry gives the queue pair, R_Key and address the worker registered for
 * that window position and the index of its PSN register, which the controller starts
 * at the worker's first PSN; each reply takes the next PSN, whether or not the egress
 * drop simulator then drops it (a gap, as a loss on the wire). The opcode follows the
 * packet's place in its message: the first carries the RETH, the last the immediate
 * (seq's low 24 bits, the slot's exponent). The ICRC is 0 (roce.p4). A miss drops the
 * reply uncounted, as a replica miss does.
 * Reference: emulation/softswitch/roce.py (RoceFront._replies).
 * Controller: controller/roce.py.
 */
#ifndef _INA_ROCE_REPLIES_P4_
#define _INA_ROCE_REPLIES_P4_

control RoceEgress(inout headers_t hdr,
                   inout metadata_t meta,
                   in standard_metadata_t standard_metadata) {
    // The base PSN of each worker queue pair (psn_reg), the worker's first, written by the
    // controller and only read here: a reply's PSN is base + (seq << ROCE_PSN_SEQ_SHIFT) +
    // its place, the same each time that packet is sent (docs/protocol.md).
    @id(0x160D0001) @name(".Egress.roce.reply_psn")
    register<bit<24>>(ROCE_QP_REGISTERS) reply_psn;

    bit<32> psn_reg;
    bit<24> psn;

    @id(0x010D0001) @name(".Egress.roce.set_roce_reply")
    action set_roce_reply(bit<24> qpn, bit<32> rkey, bit<64> va, bit<16> psn_index) {
        hdr.bth.dest_qp = qpn;
        hdr.reth.rkey = rkey;
        hdr.reth.va = va;
        psn_reg = (bit<32>)psn_index;
    }

    @id(0x010D0002) @name(".Egress.roce.roce_reply_miss")
    action roce_reply_miss() {
        meta.no_replica = 1;
    }

    @id(0x020D0001) @name(".Egress.roce.roce_replies")
    table roce_replies {
        key = {
            hdr.ina.job_id: exact @name("job_id");
            meta.reply_rank: exact @name("rank");
            meta.roce_position: exact @name("position");
        }
        actions = {
            set_roce_reply;
            @defaultonly roce_reply_miss;
        }
        const default_action = roce_reply_miss();
        size = ROCE_QP_REGISTERS;
    }

    apply {
        psn_reg = 0;
        // A replica's rank is its rid; the unicast answer's, the sender's.
        if (meta.multicast == 1) {
            meta.reply_rank = (bit<8>)standard_metadata.egress_rid;
        } else {
            meta.reply_rank = hdr.ina.rank;
        }
        bit<16> slot = (bit<16>)hdr.ina.slot;
        bit<16> mask = ((bit<16>)1 << meta.roce_shift) - 1;
        bit<16> at = slot & mask;
        meta.roce_position = slot >> meta.roce_shift;
        hdr.reth.setValid();
        roce_replies.apply();                   // a miss: dropped, as a replica miss
        if (meta.no_replica == 0) {
            reply_psn.read(psn, psn_reg);
            hdr.bth.psn = psn + ((bit<24>)hdr.ina.seq << ROCE_PSN_SEQ_SHIFT) + (bit<24>)at;
            hdr.bth.ack_req = 0;
            hdr.bth.fecn_becn_resv = 0;
            bool first = at == 0;
            bool last = at == mask;
            if (first && last) {
                hdr.bth.opcode = ROCE_WRITE_ONLY_IMM;
            } else if (first) {
                hdr.bth.opcode = ROCE_WRITE_FIRST;
            } else if (last) {
                hdr.bth.opcode = ROCE_WRITE_LAST_IMM;
            } else {
                hdr.bth.opcode = ROCE_WRITE_MIDDLE;
            }
            if (first) {
                hdr.reth.dma_length = ((bit<32>)mask + 1) * ROCE_PAYLOAD_BYTES;
            } else {
                hdr.reth.setInvalid();
            }
            if (last) {
                hdr.immdt.setValid();
                hdr.immdt.imm = hdr.ina.seq[23:0] ++ hdr.ina.exponent;
            } else {
                hdr.immdt.setInvalid();
            }
            hdr.icrc.setValid();
            hdr.icrc.crc = 0;                   // not computed: see the top of this file
            hdr.udp.src_port = ROCE_UDP_PORT;
            hdr.udp.dst_port = ROCE_UDP_PORT;
            bit<32> length = UDP_HEADER_BYTES + ROCE_BTH_BYTES + ROCE_PAYLOAD_BYTES
                + ROCE_ICRC_BYTES;
            if (first) {
                length = length + ROCE_RETH_BYTES;
            }
            if (last) {
                length = length + ROCE_IMMDT_BYTES;
            }
            hdr.udp.length = (bit<16>)length;
            hdr.ipv4.total_len = hdr.udp.length + (bit<16>)IPV4_HEADER_BYTES;
            hdr.ipv4.identification = 0;
            hdr.ipv4.flags = IPV4_FLAG_DF;
            hdr.ina.setInvalid();
        }
    }
}

#endif  // _INA_ROCE_REPLIES_P4_
