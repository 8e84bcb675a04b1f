/* tna/roce_replies.p4: TnaRoceEgress, each result that leaves for a RoCEv2 worker made a
 * UC RDMA WRITE to the worker's queue pair (roce.p4 made the INA packet it started as).
 *
 * ../roce_replies.p4's semantics, table and register: roce_replies keyed by (job, rank,
 * window position), its set_roce_reply(qpn, rkey, va, psn_index), and reply_psn, the
 * base PSN of each worker queue pair (the controller writes the worker's first; only
 * read here): a reply's PSN is base + (seq << ROCE_PSN_SEQ_SHIFT) + its place, the same
 * each time the packet is sent. The shift's offset (seq's low 27 bits, then the place's
 * 5 bits) is one deposit per roce_positions action.
 * A replica's rank is its rid, a unicast answer's the sender's; a miss drops the reply
 * uncounted, as a replica miss does. The opcode follows the packet's place in its
 * message: the first carries the RETH, the last the immediate (seq's low 24 bits, the
 * slot's exponent). The ICRC is 0 (roce.p4): ingress left it after the lanes, and the
 * BTH, RETH and ImmDt go where the INA header was (parsers.p4's emit order).
 * A Tofino ALU shifts by constants only, so the window position (slot >> msg_shift) and
 * the place (first, middle, last) come from two const tables keyed by the job's shift,
 * which ingress bridged: roce_positions and roce_places (their entries files).
 * Reference: emulation/softswitch/roce.py (RoceFront._replies). Controller:
 * controller/roce.py.
 */
#ifndef _INA_TNA_ROCE_REPLIES_P4_
#define _INA_TNA_ROCE_REPLIES_P4_

control TnaRoceEgress(inout tna_headers_t hdr,
                      inout tna_egress_metadata_t meta,
                      in egress_intrinsic_metadata_t eg_intr_md) {
    @name(".Egress.roce.reply_psn")
    Register<bit<32>, roce_qp_index_t>(ROCE_QP_REGISTERS, 0) reply_psn;

    RegisterAction<bit<32>, roce_qp_index_t, bit<32>>(reply_psn) read_psn = {
        void apply(inout bit<32> value, out bit<32> psn) {
            psn = value + meta.roce_psn_offset;
        }
    };

    @name(".Egress.roce.set_roce_reply")
    action set_roce_reply(bit<24> qpn, bit<32> rkey, bit<64> va, bit<16> psn_index) {
        hdr.bth.dest_qp = qpn;
        hdr.reth.rkey = rkey;
        hdr.reth.va = va;
        meta.psn_reg = psn_index[13:0];
    }

    @name(".Egress.roce.roce_reply_miss")
    action roce_reply_miss() {
        meta.no_replica = 1;
    }

    @name(".Egress.roce.roce_replies")
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

    // The slot's window position and its message's DMA length, by msg_shift.
    @name(".Egress.roce.roce_shift_0")
    action roce_shift_0() {
        meta.roce_position = (bit<16>)hdr.ina.pool_index[14:0];
        meta.roce_dma_length = TNA_ROCE_MSG_BYTES_1;
        meta.roce_psn_offset = hdr.ina.seq[26:0] ++ (bit<5>)0;
    }
    @name(".Egress.roce.roce_shift_1")
    action roce_shift_1() {
        meta.roce_position = (bit<16>)hdr.ina.pool_index[14:1];
        meta.roce_dma_length = TNA_ROCE_MSG_BYTES_2;
        meta.roce_psn_offset = hdr.ina.seq[26:0] ++ (bit<5>)hdr.ina.pool_index[0:0];
    }
    @name(".Egress.roce.roce_shift_2")
    action roce_shift_2() {
        meta.roce_position = (bit<16>)hdr.ina.pool_index[14:2];
        meta.roce_dma_length = TNA_ROCE_MSG_BYTES_4;
        meta.roce_psn_offset = hdr.ina.seq[26:0] ++ (bit<5>)hdr.ina.pool_index[1:0];
    }
    @name(".Egress.roce.roce_shift_3")
    action roce_shift_3() {
        meta.roce_position = (bit<16>)hdr.ina.pool_index[14:3];
        meta.roce_dma_length = TNA_ROCE_MSG_BYTES_8;
        meta.roce_psn_offset = hdr.ina.seq[26:0] ++ (bit<5>)hdr.ina.pool_index[2:0];
    }
    @name(".Egress.roce.roce_shift_4")
    action roce_shift_4() {
        meta.roce_position = (bit<16>)hdr.ina.pool_index[14:4];
        meta.roce_dma_length = TNA_ROCE_MSG_BYTES_16;
        meta.roce_psn_offset = hdr.ina.seq[26:0] ++ (bit<5>)hdr.ina.pool_index[3:0];
    }
    @name(".Egress.roce.roce_shift_5")
    action roce_shift_5() {
        meta.roce_position = (bit<16>)hdr.ina.pool_index[14:5];
        meta.roce_dma_length = TNA_ROCE_MSG_BYTES_32;
        meta.roce_psn_offset = hdr.ina.seq[26:0] ++ hdr.ina.pool_index[4:0];
    }
    @name(".Egress.roce.roce_shift_miss")
    action roce_shift_miss() {
        meta.no_replica = 1;
    }

    @name(".Egress.roce.roce_positions")
    table roce_positions {
        key = {
            hdr.bridge.roce_shift: exact @name("msg_shift");
        }
        actions = {
            roce_shift_0;
            roce_shift_1;
            roce_shift_2;
            roce_shift_3;
            roce_shift_4;
            roce_shift_5;
            @defaultonly roce_shift_miss;
        }
        const default_action = roce_shift_miss();
        const entries = {
#include "roce_positions_entries.p4"
        }
        size = 8;
    }

    // The packet's place in its message: opcode and UDP/IPv4 lengths.
    action place(bit<8> opcode, bit<1> first, bit<1> last, bit<16> udp_length) {
        hdr.bth.opcode = opcode;
        meta.roce_first = first;
        meta.roce_last = last;
        hdr.udp.length = udp_length;
        hdr.ipv4.total_len = udp_length + (bit<16>)IPV4_HEADER_BYTES;
    }
    @name(".Egress.roce.roce_only")
    action roce_only() {
        place(ROCE_WRITE_ONLY_IMM, 1, 1, (bit<16>)TNA_ROCE_UDP_ONLY_IMM);
    }
    @name(".Egress.roce.roce_first")
    action roce_first() {
        place(ROCE_WRITE_FIRST, 1, 0, (bit<16>)TNA_ROCE_UDP_FIRST);
    }
    @name(".Egress.roce.roce_middle")
    action roce_middle() {
        place(ROCE_WRITE_MIDDLE, 0, 0, (bit<16>)TNA_ROCE_UDP_BYTES);
    }
    @name(".Egress.roce.roce_last")
    action roce_last() {
        place(ROCE_WRITE_LAST_IMM, 0, 1, (bit<16>)TNA_ROCE_UDP_LAST_IMM);
    }

    @name(".Egress.roce.roce_places")
    table roce_places {
        key = {
            hdr.bridge.roce_shift: exact @name("msg_shift");
            hdr.ina.pool_index: ternary @name("pool_index");
        }
        actions = {
            roce_only;
            roce_first;
            roce_middle;
            roce_last;
        }
        const default_action = roce_middle();
        const entries = {
#include "roce_places_entries.p4"
        }
        size = 16;
    }

    apply {
        if (hdr.bridge.multicast == 1) {
            meta.reply_rank = (bit<8>)eg_intr_md.egress_rid;
        } else {
            meta.reply_rank = hdr.ina.rank;
        }
        hdr.bth.setValid();
        hdr.reth.setValid();
        roce_positions.apply();
        roce_places.apply();
        if (meta.no_replica == 0) {
            roce_replies.apply();               // a miss: dropped, as a replica miss
        }
        if (meta.no_replica == 0) {
            meta.psn = read_psn.execute(meta.psn_reg);
            hdr.bth.psn = meta.psn[23:0];
            hdr.bth.solicited = 0;
            hdr.bth.mig_req = 0;
            hdr.bth.pad_count = 0;
            hdr.bth.transport_version = 0;
            hdr.bth.pkey = 0xFFFF;
            hdr.bth.fecn_becn_resv = 0;
            hdr.bth.ack_req = 0;
            hdr.bth.resv7 = 0;
            if (meta.roce_first == 1) {
                hdr.reth.dma_length = meta.roce_dma_length;
            } else {
                hdr.reth.setInvalid();
            }
            if (meta.roce_last == 1) {
                hdr.immdt.setValid();
                hdr.immdt.imm[31:8] = hdr.ina.seq[23:0];
                hdr.immdt.imm[7:0] = hdr.ina.exponent;
            }
            hdr.udp.src_port = ROCE_UDP_PORT;
            hdr.udp.dst_port = ROCE_UDP_PORT;
            hdr.udp.checksum = 0;
            hdr.ipv4.identification = 0;
            hdr.ipv4.flags = IPV4_FLAG_DF;
            hdr.ina.setInvalid();
        }
    }
}

#endif  // _INA_TNA_ROCE_REPLIES_P4_
