/* roce.p4: INA over RoCEv2 (docs/protocol.md, "INA over RoCEv2"): RoceIngress turns a
 * UC RDMA WRITE packet into the INA DATA packet of its message's slot, so the rest of
 * ina.p4 runs unchanged; roce_replies.p4's RoceEgress turns each result leaving for a
 * RoCEv2 worker into a WRITE to that worker's queue pair, with its next PSN.
 *
 * The reference semantics are emulation/softswitch/roce.py (RoceFront): the same
 * tables, registers, checks in the same order and drop reasons, except the ICRC: a P4
 * switch neither checks nor recomputes it (the payload is 256 bytes of lanes past the
 * parsed headers' reach for a CRC extern over the whole frame), so replies carry ICRC 0
 * and hosts turn ICRC checking off, as for SwitchML-RDMA (p4/README.md, "RoCEv2").
 *
 * Messages are M = 2^msg_shift packets: a packet's place in its message and the window
 * position of its queue pair are the low and high bits of its job-relative slot, with no
 * division (Tofino has none).
 * Controller: controller/roce.py writes roce_requests and roce_jobs (and roce_replies.p4's
 * table and PSN register).
 */
#ifndef _INA_ROCE_P4_
#define _INA_ROCE_P4_

control RoceIngress(inout headers_t hdr, inout metadata_t meta) {
    // The UC responder's state of each of the switch's queue pairs (qp_reg): a message
    // open, the PSN expected next, the message's first pool index, seq and exponent,
    // and the place of its next packet.
    @id(0x160C0001) @name(".Ingress.roce.open")
    register<bit<1>>(ROCE_QP_REGISTERS) open;
    @id(0x160C0002) @name(".Ingress.roce.expect_psn")
    register<bit<24>>(ROCE_QP_REGISTERS) expect_psn;
    @id(0x160C0003) @name(".Ingress.roce.base")
    register<bit<16>>(ROCE_QP_REGISTERS) base;
    @id(0x160C0004) @name(".Ingress.roce.seq")
    register<bit<32>>(ROCE_QP_REGISTERS) seq;
    @id(0x160C0005) @name(".Ingress.roce.exponent")
    register<bit<8>>(ROCE_QP_REGISTERS) exponent;
    @id(0x160C0006) @name(".Ingress.roce.place")
    register<bit<16>>(ROCE_QP_REGISTERS) place;

    bit<32> reg;
    bit<1> is_open;
    bit<24> expected;
    bit<16> first_pidx;
    bit<32> msg_seq;
    bit<8> msg_exponent;
    bit<16> at;

    ipv4_addr_t worker_ip;

    @id(0x010C0001) @name(".Ingress.roce.set_roce_qp")
    action set_roce_qp(bit<16> job_id, bit<8> rank, bit<16> qp_reg, ipv4_addr_t ipv4_src) {
        meta.roce_job = job_id;
        meta.roce_rank = rank;
        reg = (bit<32>)qp_reg;
        worker_ip = ipv4_src;
    }

    @id(0x010C0002) @name(".Ingress.roce.roce_qp_miss")
    action roce_qp_miss() {
        meta.drop_reason = DROP_UNKNOWN_QP;
    }

    @id(0x020C0001) @name(".Ingress.roce.roce_requests")
    table roce_requests {
        key = {
            hdr.bth.dest_qp: exact @name("dest_qp");
        }
        actions = {
            set_roce_qp;
            @defaultonly roce_qp_miss;
        }
        const default_action = roce_qp_miss();
        size = ROCE_QP_REGISTERS;
    }

    @id(0x010C0003) @name(".Ingress.roce.set_roce_job")
    action set_roce_job(bit<8> msg_shift) {
        meta.roce_shift = msg_shift;
    }

    @id(0x010C0004) @name(".Ingress.roce.roce_job_miss")
    action roce_job_miss() {
        meta.drop_reason = DROP_UNKNOWN_JOB;
    }

    @id(0x020C0002) @name(".Ingress.roce.roce_jobs")
    table roce_jobs {
        key = {
            meta.roce_job: exact @name("job_id");
        }
        actions = {
            set_roce_job;
            @defaultonly roce_job_miss;
        }
        const default_action = roce_job_miss();
        size = JOB_TABLE_SIZE;
    }

    apply {
        reg = 0;
        at = 0;
        first_pidx = 0;
        worker_ip = 0;
        // Parse (parsers.p4 set the opcode's flags): a frame too short for its headers,
        // or an opcode INA does not send.
        if (!hdr.bth.isValid() || (bit<32>)hdr.udp.length
                < UDP_HEADER_BYTES + ROCE_BTH_BYTES + ROCE_ICRC_BYTES) {
            meta.drop_reason = DROP_TRUNCATED;
        } else if (meta.roce_opcode_ok == 0) {
            meta.drop_reason = DROP_MALFORMED;
        } else if ((meta.roce_first == 1 && !hdr.reth.isValid())
                   || (meta.roce_imm == 1 && !hdr.immdt.isValid())) {
            meta.drop_reason = DROP_TRUNCATED;
        }
        if (meta.drop_reason == NO_DROP) {
            roce_requests.apply();              // DROP_UNKNOWN_QP
        }
        if (meta.drop_reason == NO_DROP) {
            roce_jobs.apply();                  // DROP_UNKNOWN_JOB
        }
        // Only the queue pair's worker may touch its state: before the UC step.
        if (meta.drop_reason == NO_DROP && hdr.ipv4.src_addr != worker_ip) {
            meta.drop_reason = DROP_BAD_SOURCE;
        }
        // The workers table (ina.p4) binds a RoCEv2 rank at (its address, 4791), since
        // RoCEv2 source ports vary per queue pair.
        hdr.udp.src_port = ROCE_UDP_PORT;

        // The UC responder's step (RoceFront._advance).
        if (meta.drop_reason == NO_DROP) {
            open.read(is_open, reg);
            expect_psn.read(expected, reg);
            place.read(at, reg);
            bit<16> packets = (bit<16>)1 << meta.roce_shift;
            if (meta.roce_first == 1) {
                is_open = 0;
                if (hdr.reth.rkey[31:16] != 0) {
                    meta.drop_reason = DROP_MALFORMED;
                } else if (hdr.reth.dma_length != (bit<32>)packets * ROCE_PAYLOAD_BYTES) {
                    meta.drop_reason = DROP_BAD_LENGTH;
                } else if ((hdr.reth.rkey[14:0] & (bit<15>)(packets - 1)) != 0) {
                    meta.drop_reason = DROP_BAD_SLOT;
                } else {
                    first_pidx = hdr.reth.rkey[15:0];
                    base.write(reg, first_pidx);
                    seq.write(reg, hdr.reth.va[63:32]);
                    exponent.write(reg, hdr.reth.va[31:24]);
                    at = 0;
                }
            } else if (is_open == 0 || hdr.bth.psn != expected) {
                is_open = 0;
                meta.drop_reason = DROP_BAD_PSN;
            }
            if (meta.drop_reason == NO_DROP && at >= packets) {
                is_open = 0;
                meta.drop_reason = DROP_BAD_SLOT;
            }
            if (meta.drop_reason == NO_DROP) {
                expect_psn.write(reg, hdr.bth.psn + 1);
                is_open = ~meta.roce_last;
                bit<32> headers = UDP_HEADER_BYTES + ROCE_BTH_BYTES + ROCE_ICRC_BYTES;
                if (meta.roce_first == 1) {
                    headers = headers + ROCE_RETH_BYTES;
                }
                if (meta.roce_imm == 1) {
                    headers = headers + ROCE_IMMDT_BYTES;
                }
                if (!hdr.ina_data.isValid() || !hdr.icrc.isValid()
                        || (bit<32>)hdr.udp.length != headers + ROCE_PAYLOAD_BYTES) {
                    is_open = 0;
                    meta.drop_reason = DROP_BAD_LENGTH;
                }
            }
            open.write(reg, is_open);
        }

        // The INA DATA packet the frame stands for: its message's slot + place.
        if (meta.drop_reason == NO_DROP) {
            base.read(first_pidx, reg);
            seq.read(msg_seq, reg);
            exponent.read(msg_exponent, reg);
            place.write(reg, at + 1);
            hdr.ina.setValid();
            hdr.ina.version = PROTOCOL_VERSION;
            hdr.ina.ptype = PTYPE_DATA;
            hdr.ina.flags = 0;
            hdr.ina.job_id = meta.roce_job;
            hdr.ina.rank = meta.roce_rank;
            hdr.ina.exponent = msg_exponent;
            hdr.ina.num_lanes = (bit<16>)LANES_PER_PACKET;
            hdr.ina.pool_set = first_pidx[15:15];
            hdr.ina.slot = first_pidx[14:0] + (bit<15>)at;
            hdr.ina.reserved = 0;
            hdr.ina.seq = msg_seq;
        }
    }
}

#endif  // _INA_ROCE_P4_
