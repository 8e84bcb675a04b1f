/* ina.p4: the INA aggregation switch for bmv2 (v1model), SwitchML's algorithm with
 * ATP-style per-job slot ranges and a seq register that drops delayed retransmissions.
 *
 * The reference semantics are emulation/softswitch/pipeline.py (Pipeline.process):
 * Ingress runs the same checks in the same order, drops with the same reasons and
 * counts the same statistics. docs/protocol.md explains the algorithm; p4/README.md
 * how to compile and run this program and what each file holds. A job with an entry
 * in upstream.p4's table is aggregated in two levels: this switch (the leaf) sends the
 * partial sum of its local workers up and multicasts the upstream switch's RESULT. A job
 * with entries in sharing.p4's tables has slots past its reservation in a region of the
 * pool that jobs share, best effort, and a fallback aggregator on a server for what the
 * switch cannot hold, whose RESULTs this switch multicasts (docs/sharing.md).
 */
#include <core.p4>
#include <v1model.p4>

#include "configuration.p4"
#include "types.p4"
#include "headers.p4"
#include "parsers.p4"
#include "checksums.p4"
#include "drop_simulator.p4"
#include "upstream.p4"
#include "sharing.p4"
#include "jobs.p4"
#include "workers.p4"
#include "seq_check.p4"
#include "bitmap.p4"
#include "workers_counter.p4"
#include "exponents.p4"
#include "values.p4"
#include "next_step.p4"
#include "forwarder.p4"
#include "replicas.p4"
#include "roce.p4"
#include "roce_replies.p4"

control InaIngress(inout headers_t hdr,
                inout metadata_t meta,
                inout standard_metadata_t standard_metadata) {
    // Indexed by STAT_* and DROP_* (configuration.p4).
    @id(0x12010001) @name(".Ingress.ina_stats")
    counter(NUM_STATS, CounterType.packets) ina_stats;
    @id(0x12010002) @name(".Ingress.drops")
    counter(NUM_DROP_REASONS, CounterType.packets) drops;

    // The use each (set, slot) holds: its seq (0: unused) and its down-counter (0: idle
    // or finished). Declared here, not in seq_check.p4 or workers_counter.p4, because
    // both are read before the bitmaps and written after them.
    @id(0x16010001) @name(".Ingress.seq")
    register<bit<32>>(REGISTER_SIZE) seq;
    @id(0x16010002) @name(".Ingress.remaining")
    register<bit<32>>(REGISTER_SIZE) remaining;
    // 1: the (set, slot) holds the upstream switch's result, 0: only the local partial
    // sum (upstream.p4). Read with seq and remaining, cleared by a use's first
    // contribution, set by the upstream switch's RESULT.
    @id(0x16010003) @name(".Ingress.final")
    register<bit<1>>(REGISTER_SIZE) final;

    IngressDropSimulator() drop_simulator;
    RoceIngress() roce;
    Upstream() upstream;
    SharingIngress() sharing;
    Jobs() jobs;
    Workers() workers;
    SeqCheck() seq_check;
    Bitmap() bitmap;
    WorkersCounter() workers_counter;
    Exponents() exponents;
    Values() values;
    NextStep() next_step;
    Forwarder() forwarder;

    apply {
        meta.drop_reason = NO_DROP;
        if (meta.is_ina == 0) {
            forwarder.apply(hdr, meta, standard_metadata);
        } else {
            ina_stats.count(STAT_RECEIVED);
            drop_simulator.apply(meta);
            if (meta.drop_reason == NO_DROP && meta.is_roce == 1) {
                roce.apply(hdr, meta);           // RoCEv2 -> the INA DATA packet (roce.p4)
            }

            // Checks, in pipeline.Pipeline.process order.
            if (meta.drop_reason == NO_DROP) {
                if (!hdr.ina.isValid()
                        || (bit<32>)hdr.udp.length < UDP_HEADER_BYTES + HEADER_SIZE) {
                    // standard_metadata.parser_error is PacketTooShort (parsers.p4); or a
                    // frame padded to Ethernet's 60 bytes completed the header of a shorter
                    // datagram, which its UDP length tells (as the soft switch on ports).
                    meta.drop_reason = DROP_TRUNCATED;
                } else if (hdr.ina.version != PROTOCOL_VERSION) {
                    meta.drop_reason = DROP_MALFORMED;
                } else {
                    // Applied once for DATA and RESULT alike (a table is applied once).
                    upstream.apply(hdr, meta);
                    sharing.apply(hdr, meta);
                    // The control plane never gives a job both a fallback and an
                    // upstream entry.
                    if (hdr.ina.ptype == PTYPE_RESULT && meta.has_fallback == 1) {
                        meta.from_fallback = 1;  // the fallback aggregator's result
                    } else if (hdr.ina.ptype == PTYPE_RESULT && meta.has_upstream == 1) {
                        meta.from_upstream = 1;  // the upstream switch's answer
                    } else if (hdr.ina.ptype != PTYPE_DATA) {
                        meta.drop_reason = DROP_MALFORMED;
                    }
                }
            }
            if (meta.drop_reason == NO_DROP) {
                jobs.apply(hdr, meta);           // DROP_UNKNOWN_JOB, DROP_BAD_RANK
            }
            if (meta.drop_reason == NO_DROP) {
                if (meta.from_upstream == 1) {
                    // Only the upstream switch answers for the job's partial sums.
                    if (hdr.ipv4.src_addr != meta.upstream_ip
                            || hdr.udp.src_port != meta.upstream_udp_port) {
                        meta.drop_reason = DROP_BAD_SOURCE;
                    }
                } else if (meta.from_fallback == 1) {
                    // ... and only the fallback aggregator for what was passed to it.
                    if (hdr.ipv4.src_addr != meta.fallback_ip
                            || hdr.udp.src_port != meta.fallback_udp_port) {
                        meta.drop_reason = DROP_BAD_SOURCE;
                    }
                } else {
                    workers.apply(hdr, meta);    // DROP_BAD_SOURCE
                }
            }
            if (meta.drop_reason == NO_DROP) {
                if ((bit<32>)hdr.ina.slot < meta.slot_count) {
                    meta.in_reservation = 1;
                }
                // A slot past the reservation: the shared region or the fallback, for a
                // job with either (DATA); a fallback's RESULT has no slot here.
                if (meta.from_fallback == 0 && meta.in_reservation == 0
                        && (meta.from_upstream == 1
                            || (meta.has_shared == 0 && meta.has_fallback == 0))) {
                    meta.drop_reason = DROP_BAD_SLOT;
                } else if ((bit<32>)hdr.ina.num_lanes != LANES_PER_PACKET) {
                    meta.drop_reason = DROP_BAD_LANES;
                } else if (meta.is_roce == 0 && (!hdr.ina_data.isValid()
                           || (bit<32>)hdr.udp.length != UDP_HEADER_BYTES + INA_PAYLOAD_BYTES
                           || (bit<32>)hdr.ipv4.total_len
                              != IPV4_HEADER_BYTES + UDP_HEADER_BYTES + INA_PAYLOAD_BYTES)) {
                    meta.drop_reason = DROP_BAD_LENGTH;
                }
            }

            // Where the slot is (sharing.Sharing.place): the job's reservation, else its
            // cell in the shared region (the owner register, sharing.p4), else the
            // fallback (DROP_BAD_SLOT for a job without one).
            if (meta.drop_reason == NO_DROP && meta.from_fallback == 1) {
                from_fallback.count(meta.fallback_stats);
            } else if (meta.drop_reason == NO_DROP) {
                meta.slot = meta.slot_base + (bit<32>)hdr.ina.slot;
                if (meta.in_reservation == 0) {
                    bit<32> t = (bit<32>)hdr.ina.slot - meta.slot_count;
                    meta.to_fallback = 1;        // past the shared count, or no entry
                    if (meta.has_shared == 1 && t < meta.shared_count) {
                        bit<32> cell = meta.shared_base
                            + ((meta.shared_offset + t) & meta.shared_mask);
                        bit<32> me = ((bit<32>)hdr.ina.job_id << 16)
                            | ((bit<32>)hdr.ina.slot + 1);
                        bit<32> held;
                        owner.read(held, cell);
                        if (held == 0) {
                            owner.write(cell, me);  // free: this job slot takes it
                        }
                        if (held == 0 || held == me) {
                            meta.slot = cell;
                            meta.to_fallback = 0;
                        } else {
                            collisions.count(meta.shared_stats);
                        }
                    }
                    if (meta.to_fallback == 1 && meta.has_fallback == 0) {
                        meta.to_fallback = 0;
                        meta.drop_reason = DROP_BAD_SLOT;
                    }
                }
            }

            // Step 1: the use the (set, slot) holds; stale packets stop here.
            if (meta.drop_reason == NO_DROP && meta.to_fallback == 0
                    && meta.from_fallback == 0) {
                // Uses of a loose slot may also run at another place (sharing.p4).
                if (meta.in_reservation == 0 || meta.is_behind == 1) {
                    meta.loose = 1;
                }
                meta.index = (bit<32>)hdr.ina.pool_set * SWITCH_SLOTS + meta.slot;
                seq.read(meta.stored_seq, meta.index);
                remaining.read(meta.remaining, meta.index);
                final.read(meta.is_final, meta.index);
                seq_check.apply(hdr, meta);      // DROP_STALE, meta.answer, meta.resend_up,
                                                 // meta.restart, meta.to_fallback
            }

            // Steps 2 and 3: bitmaps, then a new contribution writes or adds.
            if (meta.drop_reason == NO_DROP && meta.answer == 0 && meta.resend_up == 0
                    && meta.from_upstream == 0 && meta.from_fallback == 0
                    && meta.to_fallback == 0) {
                bitmap.apply(hdr, meta);
                if (meta.seen == 1) {
                    if (meta.in_reservation == 0 && (hdr.ina.flags & FLAG_RESEND) != 0
                            && meta.has_fallback == 1) {
                        // Counted here, still unanswered: the others may have their
                        // result from the fallback and not send this use here again.
                        meta.to_fallback = 1;
                    } else {
                        ina_stats.count(STAT_DUPLICATES_IGNORED);
                    }
                } else {
                    workers_counter.apply(meta);
                    remaining.write(meta.index, meta.remaining);
                    if (meta.first == 1) {
                        seq.write(meta.index, hdr.ina.seq);
                        final.write(meta.index, 0);
                        if (meta.in_reservation == 0) {
                            shared_uses.count(meta.shared_stats);
                        }
                    }
                    ina_stats.count(STAT_AGGREGATED);
                    if (meta.complete == 1) {
                        ina_stats.count(STAT_COMPLETED);
                        if (meta.has_upstream == 1) {
                            meta.send_up = 1;    // the partial sum, instead of multicast
                        }
                    }
                }
            }
            if (meta.answer == 1) {
                ina_stats.count(STAT_RETRANSMITS_ANSWERED);
                meta.lane_op = LANE_OP_READ;
            }
            if (meta.resend_up == 1) {
                ina_stats.count(STAT_UPSTREAM_RESENT);
                meta.lane_op = LANE_OP_READ;
                meta.send_up = 1;
            }
            if (meta.drop_reason == NO_DROP && meta.from_upstream == 1) {
                if (meta.is_final == 1) {
                    // Another copy (the spine answers every re-sent partial): the first
                    // was multicast; a worker that lost it is answered by unicast.
                    ina_stats.count(STAT_DUPLICATES_IGNORED);
                } else {
                    // The spine's result becomes the slot's value: written, not added.
                    ina_stats.count(STAT_RESULTS_FROM_UPSTREAM);
                    final.write(meta.index, 1);
                    meta.lane_op = LANE_OP_WRITE;
                    meta.take_result = 1;
                }
            }
            if (meta.lane_op != LANE_OP_NONE) {
                exponents.apply(hdr, meta);
                values.apply(hdr, meta);
            }

            // Step 4: multicast a completed slot, the spine's or the fallback's result,
            // answer a retransmission, send a partial sum up, pass a packet on to the
            // fallback, or consume.
            if (meta.drop_reason == NO_DROP) {
                next_step.apply(hdr, meta, standard_metadata);
            } else {
                drops.count(meta.drop_reason);
                mark_to_drop(standard_metadata);
            }
        }
    }
}

control InaEgress(inout headers_t hdr,
               inout metadata_t meta,
               inout standard_metadata_t standard_metadata) {
    // Same indices as Ingress's: egress counts STAT_RESULTS_SENT, STAT_SENT_UPSTREAM and
    // DROP_SIM_EGRESS (and sharing.p4 the packets that leave for the fallback).
    @id(0x12020001) @name(".Egress.ina_stats")
    counter(NUM_STATS, CounterType.packets) ina_stats;
    @id(0x12020002) @name(".Egress.drops")
    counter(NUM_DROP_REASONS, CounterType.packets) drops;

    Replicas() replicas;
    RoceEgress() roce;
    EgressDropSimulator() drop_simulator;

    apply {
        if (meta.result == 1 || meta.upward == 1 || meta.to_fallback == 1) {
            if (meta.multicast == 1) {
                replicas.apply(hdr, meta, standard_metadata);
            }
            if (meta.is_roce == 1 && meta.no_replica == 0 && meta.to_fallback == 0) {
                roce.apply(hdr, meta, standard_metadata);  // the WRITE, its PSN taken
            }
            if (meta.no_replica == 1) {
                mark_to_drop(standard_metadata);
            } else {
                drop_simulator.apply(meta);      // DROP_SIM_EGRESS, per packet that leaves
                if (meta.drop_reason == DROP_SIM_EGRESS) {
                    drops.count(DROP_SIM_EGRESS);
                    mark_to_drop(standard_metadata);
                } else if (meta.upward == 1) {
                    ina_stats.count(STAT_SENT_UPSTREAM);
                } else if (meta.to_fallback == 1) {
                    to_fallback.count(meta.fallback_stats);  // sharing.p4
                    if (meta.is_roce == 1) {
                        // A RoCEv2 frame has no INA form to pass on, and the fallback is
                        // no queue pair to write to: counted, then dropped, as the soft
                        // switch's RoceFront finds no reply entry for it.
                        mark_to_drop(standard_metadata);
                    }
                } else {
                    ina_stats.count(STAT_RESULTS_SENT);
                }
            }
        } else if (meta.flooded == 1
                   && standard_metadata.egress_port == standard_metadata.ingress_port) {
            mark_to_drop(standard_metadata);
        }
    }
}

V1Switch(IngressParser(),
         InaVerifyChecksum(),
         InaIngress(),
         InaEgress(),
         InaComputeChecksum(),
         InaDeparser()) main;
