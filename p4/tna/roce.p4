/* tna/roce.p4: TnaRoceIngress, INA over RoCEv2 on Tofino: a UC RDMA WRITE packet made the
 * INA DATA packet of its message's slot, so the rest of ina_tna.p4 runs unchanged
 * (roce_replies.p4 makes each result a WRITE again).
 *
 * The semantics are ../roce.p4's (and emulation/softswitch/roce.py's): the same tables
 * (roce_requests, roce_jobs: names, keys, actions and parameters, so controller/roce.py
 * writes both programs alike), the same checks in the same order and drop reasons. Not
 * the ICRC: Tofino cannot check or compute it (a CRC over the whole frame, payload
 * included, which the parser does not reach), so replies carry ICRC 0 and hosts turn
 * ICRC checking off, as for SwitchML-RDMA. How Tofino's limits shape the rest:
 *   - no shift by a field: the message's packets (2^msg_shift) are a const table,
 *     roce_shapes, keyed by the shift, which also holds a FIRST's checks of its DMA
 *     length and slot alignment as entries (a gateway compares a field with constants
 *     only);
 *   - one stateful ALU per register and pass, 4 a stage: the queue pair's UC state is
 *     five registers, each stepped by one RegisterAction. expect_psn holds the next PSN
 *     (bits 31..8) with ROCE_QP_OPEN set while a message is open (one comparison checks
 *     both); base
 *     holds the pool index of the message's next packet (so its output is the packet's
 *     pool index, with no addition after it); place counts the message's packets
 *     against its mask; seq and exponent are written by a FIRST and read by the rest.
 *     v1model writes them after its checks; here they step whenever the queue pair's
 *     worker sent an in-order kind of packet, which a UC responder cannot tell apart:
 *     a refused FIRST still closes the queue pair (expect_psn 0), as ../roce.p4's does,
 *     and a MIDDLE or LAST after a failure is bad_psn until the next FIRST. One
 *     difference: a packet beyond its message's packets (bad_slot) leaves the queue
 *     pair open, so the next one is bad_slot too where ../roce.p4 says bad_psn.
 *   - one resubmission (seq.p4): a use's first packet runs twice, and pass 2 only reads
 *     the state pass 1 stepped (base's peek undoes its increment).
 *   - the ingress drop simulator decides before any state changes: the stateful steps
 *     wait for its stage; the tables before them are stateless.
 * The stages: 0 roce_requests, 1 roce_jobs and the source check, 2 roce_shapes, 3 the
 * queue pair's registers, which give the INA packet its pool index, seq and exponent;
 * ina_tna.p4's jobs table follows (p4/README.md, "Tofino: stages").
 * Controller: controller/roce.py.
 */
#ifndef _INA_TNA_ROCE_P4_
#define _INA_TNA_ROCE_P4_

// The frame's lookups and header checks: stateless, so they run before the ingress drop
// simulator decides (stages 0-2).
control TnaRoceRequests(inout tna_headers_t hdr, inout tna_ingress_metadata_t meta) {
    @hidden  // called from apply only: not a table's, so not the P4Info's
    action drop(bit<8> reason) {
        meta.roce_dropped = 1;
        meta.roce_reason = reason;
    }

    @name(".Ingress.roce.set_roce_qp")
    action set_roce_qp(bit<16> job_id, bit<8> rank, bit<16> qp_reg, ipv4_addr_t ipv4_src) {
        meta.roce_job = job_id;
        meta.roce_rank = rank;
        meta.roce_reg = qp_reg[13:0];
        meta.roce_src_diff = hdr.ipv4.src_addr ^ ipv4_src;
    }

    @name(".Ingress.roce.roce_qp_miss")
    action roce_qp_miss() {
        meta.roce_qp_miss = 1;                  // DROP_UNKNOWN_QP, in its turn
    }

    @name(".Ingress.roce.roce_requests")
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

    @name(".Ingress.roce.set_roce_job")
    action set_roce_job(bit<8> msg_shift) {
        meta.roce_shift = msg_shift;
    }

    @name(".Ingress.roce.roce_job_miss")
    action roce_job_miss() {
        meta.roce_job_miss = 1;                 // DROP_UNKNOWN_JOB, in its turn
    }

    @name(".Ingress.roce.roce_jobs")
    table roce_jobs {
        key = {
            meta.roce_job: exact @name("job_id");
        }
        actions = {
            set_roce_job;
            @defaultonly roce_job_miss;
        }
        const default_action = roce_job_miss();
        size = TNA_JOB_TABLE_SIZE;
    }

    // The message's packets - 1.
    @name(".Ingress.roce.roce_shape")
    action roce_shape(bit<16> mask) {
        meta.roce_mask = mask;
    }

    // A FIRST's R_Key, DMA length or slot is not its message's: it closes the queue pair.
    @name(".Ingress.roce.roce_first_bad")
    action roce_first_bad(bit<8> reason) {
        meta.roce_first_bad = 1;
        meta.roce_first_reason = reason;
    }

    @name(".Ingress.roce.roce_shapes")
    table roce_shapes {
        key = {
            meta.roce_first: ternary @name("first");
            meta.roce_shift: ternary @name("msg_shift");
            hdr.reth.dma_length: ternary @name("dma_length");
            hdr.reth.rkey: ternary @name("rkey");
        }
        actions = {
            roce_shape;
            roce_first_bad;
        }
        const default_action = roce_first_bad((bit<8>)DROP_BAD_LENGTH);
        const entries = {
#include "roce_shapes_entries.p4"
        }
        size = 64;
    }

    apply {
        // The lookups run on every frame (they change no state) and leave flags; the
        // checks then take ../roce.p4's order, a one-bit flag each: a gateway reads at
        // most 4 bytes and 12 bits of fields.
        roce_requests.apply();                  // stage 0
        // The INA DATA packet the frame stands for (its pool index, seq and exponent come
        // from the queue pair's registers below); the workers table (ina_tna.p4) binds a
        // RoCEv2 rank at (its address, 4791): RoCEv2 source ports vary per queue pair.
        hdr.ina.setValid();
        hdr.ina.version = PROTOCOL_VERSION;
        hdr.ina.ptype = PTYPE_DATA;
        hdr.ina.flags = 0;
        hdr.ina.job_id = meta.roce_job;
        hdr.ina.rank = meta.roce_rank;
        hdr.ina.num_lanes = (bit<16>)TNA_LANES_PER_PACKET;
        hdr.ina.reserved = 0;
        hdr.udp.src_port = ROCE_UDP_PORT;
        if (!hdr.bth.isValid()) {
            meta.roce_short = 1;
        }
        // UDP length < 24 (UDP_HEADER_BYTES + ROCE_BTH_BYTES + ROCE_ICRC_BYTES), in exact
        // matches: a gateway's range comparisons reach 12 bits.
        if (hdr.udp.length[15:5] == 0 && hdr.udp.length[4:3] != 3) {
            meta.roce_short = 1;
        }
        if (meta.roce_first == 1 && !hdr.reth.isValid()) {
            meta.roce_missing = 1;
        }
        if (meta.roce_imm == 1 && !hdr.immdt.isValid()) {
            meta.roce_missing = 1;
        }
        // The UDP length each opcode's frame has, with its lanes and ICRC.
        if (hdr.ina_data.isValid() && hdr.icrc.isValid()) {
            if (meta.roce_first == 1) {
                if (meta.roce_imm == 1) {
                    if (hdr.udp.length == (bit<16>)TNA_ROCE_UDP_ONLY_IMM) {
                        meta.roce_len_ok = 1;
                    }
                } else if (hdr.udp.length == (bit<16>)TNA_ROCE_UDP_FIRST) {
                    meta.roce_len_ok = 1;
                }
            } else if (meta.roce_imm == 1) {
                if (hdr.udp.length == (bit<16>)TNA_ROCE_UDP_LAST_IMM) {
                    meta.roce_len_ok = 1;
                }
            } else if (hdr.udp.length == (bit<16>)TNA_ROCE_UDP_BYTES) {
                meta.roce_len_ok = 1;
            }
        }
        // expect_psn's form: the PSN in bits 31..8, so that + 1 wraps as PSNs do.
        meta.roce_psn_open = hdr.bth.psn ++ (bit<8>)ROCE_QP_OPEN;
        meta.roce_next_open = meta.roce_psn_open + ROCE_QP_PSN_ONE;
        if (meta.roce_last == 0 && meta.roce_len_ok == 1) {
            meta.roce_opens = 1;
        }
        roce_jobs.apply();                      // stage 1
        if (meta.roce_src_diff != 0) {
            meta.roce_bad_source = 1;
        }
        roce_shapes.apply();                    // stage 2: DROP_MALFORMED (R_Key bits
                                                // 31..16), DROP_BAD_LENGTH, DROP_BAD_SLOT
        if (meta.roce_short == 1) {
            drop((bit<8>)DROP_TRUNCATED);
        } else if (meta.roce_opcode_ok == 0) {
            drop((bit<8>)DROP_MALFORMED);
        } else if (meta.roce_missing == 1) {
            drop((bit<8>)DROP_TRUNCATED);
        } else if (meta.roce_qp_miss == 1) {
            drop((bit<8>)DROP_UNKNOWN_QP);
        } else if (meta.roce_job_miss == 1) {
            drop((bit<8>)DROP_UNKNOWN_JOB);
        } else if (meta.roce_bad_source == 1) {
            // Only the queue pair's worker may touch its state.
            drop((bit<8>)DROP_BAD_SOURCE);
        }
    }
}

// The queue pair's UC step (stage 3), once the drop simulator let the packet in.
control TnaRoceStep(inout tna_headers_t hdr, inout tna_ingress_metadata_t meta) {
    @name(".Ingress.roce.expect_psn")
    Register<bit<32>, roce_qp_index_t>(ROCE_QP_REGISTERS, 0) expect_psn;
    @name(".Ingress.roce.place")
    Register<bit<16>, roce_qp_index_t>(ROCE_QP_REGISTERS, 0) place;
    @name(".Ingress.roce.base")
    Register<bit<16>, roce_qp_index_t>(ROCE_QP_REGISTERS, 0) base;
    @name(".Ingress.roce.seq")
    Register<bit<32>, roce_qp_index_t>(ROCE_QP_REGISTERS, 0) seq;
    @name(".Ingress.roce.exponent")
    Register<bit<8>, roce_qp_index_t>(ROCE_QP_REGISTERS, 0) exponent;

    // A FIRST or ONLY opens a message at any PSN (roce_opens: unless it is also the
    // last, or its length is wrong). The stateful ALU reads two fields at most, so
    // whether the packet leaves the message open picks the RegisterAction.
    RegisterAction<bit<32>, roce_qp_index_t, bit<8>>(expect_psn) psn_first = {
        void apply(inout bit<32> value, out bit<8> ok) {
            value = meta.roce_next_open;
            ok = 1;
        }
    };

    // A FIRST or ONLY that leaves no message open, or that roce_shapes refused.
    RegisterAction<bit<32>, roce_qp_index_t, bit<8>>(expect_psn) psn_close = {
        void apply(inout bit<32> value, out bit<8> ok) {
            value = 0;
            ok = 1;
        }
    };

    // A MIDDLE or LAST: the expected PSN of an open message, else the queue pair closes.
    RegisterAction<bit<32>, roce_qp_index_t, bit<8>>(expect_psn) psn_next = {
        void apply(inout bit<32> value, out bit<8> ok) {
            if (value == meta.roce_psn_open) {
                value = meta.roce_next_open;
                ok = 1;
            } else {
                value = 0;
                ok = 0;
            }
        }
    };

    // The same for a packet that leaves no message open (a LAST, or a wrong length).
    RegisterAction<bit<32>, roce_qp_index_t, bit<8>>(expect_psn) psn_next_close = {
        void apply(inout bit<32> value, out bit<8> ok) {
            if (value == meta.roce_psn_open) {
                ok = 1;
            } else {
                ok = 0;
            }
            value = 0;
        }
    };

    RegisterAction<bit<16>, roce_qp_index_t, bit<8>>(place) place_first = {
        void apply(inout bit<16> value, out bit<8> over) {
            value = 1;
            over = 0;
        }
    };

    // The packet's place in its message is the register; beyond the mask, bad_slot.
    RegisterAction<bit<16>, roce_qp_index_t, bit<8>>(place) place_next = {
        void apply(inout bit<16> value, out bit<8> over) {
            if (value > meta.roce_mask) {
                over = 1;
            } else {
                value = value + 1;
                over = 0;
            }
        }
    };

    RegisterAction<bit<16>, roce_qp_index_t, bit<16>>(base) base_first = {
        void apply(inout bit<16> value, out bit<16> pool_index) {
            value = hdr.reth.rkey[15:0] + 1;
            pool_index = hdr.reth.rkey[15:0];
        }
    };

    RegisterAction<bit<16>, roce_qp_index_t, bit<16>>(base) base_next = {
        void apply(inout bit<16> value, out bit<16> pool_index) {
            pool_index = value;
            value = value + 1;
        }
    };

    // Pass 2: the pool index pass 1 took.
    RegisterAction<bit<16>, roce_qp_index_t, bit<16>>(base) base_peek = {
        void apply(inout bit<16> value, out bit<16> pool_index) {
            pool_index = value - 1;
        }
    };

    RegisterAction<bit<32>, roce_qp_index_t, bit<32>>(seq) seq_first = {
        void apply(inout bit<32> value, out bit<32> out_seq) {
            value = hdr.reth.va[63:32];
            out_seq = hdr.reth.va[63:32];
        }
    };

    RegisterAction<bit<32>, roce_qp_index_t, bit<32>>(seq) seq_read = {
        void apply(inout bit<32> value, out bit<32> out_seq) {
            out_seq = value;
        }
    };

    RegisterAction<bit<8>, roce_qp_index_t, bit<8>>(exponent) exponent_first = {
        void apply(inout bit<8> value, out bit<8> out_exponent) {
            value = hdr.reth.va[31:24];
            out_exponent = hdr.reth.va[31:24];
        }
    };

    RegisterAction<bit<8>, roce_qp_index_t, bit<8>>(exponent) exponent_read = {
        void apply(inout bit<8> value, out bit<8> out_exponent) {
            out_exponent = value;
        }
    };

    apply {
        // Counted unless the drop simulator dropped the packet first (ina_tna.p4).
        bool counts = meta.sim_drop == 0 || meta.second_pass == 1;
        if (meta.roce_dropped == 1 && counts) {
            meta.drop_reason = meta.roce_reason;
        }

        // The UC responder's step, once the drop simulator let the packet in.
        meta.roce_psn_ok = 1;
        if (meta.roce_dropped == 0 && counts) {
            if (meta.second_pass == 0) {
                if (meta.roce_first == 1) {
                    if (meta.roce_first_bad == 0 && meta.roce_opens == 1) {
                        meta.roce_psn_ok = psn_first.execute(meta.roce_reg);
                    } else {
                        meta.roce_psn_ok = psn_close.execute(meta.roce_reg);
                    }
                } else if (meta.roce_opens == 1) {
                    meta.roce_psn_ok = psn_next.execute(meta.roce_reg);
                } else {
                    meta.roce_psn_ok = psn_next_close.execute(meta.roce_reg);
                }
            }
            if (meta.roce_first_bad == 0) {
                if (meta.second_pass == 1) {
                    hdr.ina.pool_index = base_peek.execute(meta.roce_reg);
                } else if (meta.roce_first == 1) {
                    meta.roce_over = place_first.execute(meta.roce_reg);
                    hdr.ina.pool_index = base_first.execute(meta.roce_reg);
                } else {
                    meta.roce_over = place_next.execute(meta.roce_reg);
                    hdr.ina.pool_index = base_next.execute(meta.roce_reg);
                }
                if (meta.roce_first == 1 && meta.second_pass == 0) {
                    hdr.ina.seq = seq_first.execute(meta.roce_reg);
                    hdr.ina.exponent = exponent_first.execute(meta.roce_reg);
                } else {
                    hdr.ina.seq = seq_read.execute(meta.roce_reg);
                    hdr.ina.exponent = exponent_read.execute(meta.roce_reg);
                }
            }
        }
        // What egress needs to make each result a WRITE; the frame goes on as INA.
        hdr.bth.setInvalid();
        hdr.reth.setInvalid();
        hdr.immdt.setInvalid();
        hdr.icrc.crc = 0;                       // not computed: see the top of this file
        hdr.bridge.roce = 1;
        hdr.bridge.roce_shift = meta.roce_shift;
    }
}

// The queue pair's verdict on a packet its registers stepped, in ../roce.p4's order:
// applied by ina_tna.p4 just before its checks, so that the INA tables need not follow
// it in the pipeline (Tofino places a table after the tables of the block before it).
control TnaRoceVerdict(inout tna_ingress_metadata_t meta) {
    apply {
        if (meta.roce_dropped == 0 && (meta.sim_drop == 0 || meta.second_pass == 1)) {
            if (meta.roce_first_bad == 1) {
                meta.drop_reason = meta.roce_first_reason;
            } else if (meta.roce_psn_ok == 0) {
                meta.drop_reason = (bit<8>)DROP_BAD_PSN;
            } else if (meta.roce_over == 1) {
                meta.drop_reason = (bit<8>)DROP_BAD_SLOT;
            } else if (meta.roce_len_ok == 0) {
                meta.drop_reason = (bit<8>)DROP_BAD_LENGTH;
            }
        }
    }
}

#endif  // _INA_TNA_ROCE_P4_
