/* ina.p4: the INA aggregation switch for bmv2 (v1model), SwitchML's algorithm with
 * ATP-style per-job slot ranges and a seq register that drops delayed retransmissions.
 *
 * The reference semantics are emulation/softswitch/pipeline.py (Pipeline.process):
 * Ingress runs the same checks in the same order, drops with the same reasons and
 * counts the same statistics. docs/protocol.md explains the algorithm; p4/README.md
 * how to compile and run this program and what each file holds.
 */
#include <core.p4>
#include <v1model.p4>

#include "configuration.p4"
#include "types.p4"
#include "headers.p4"
#include "parsers.p4"
#include "checksums.p4"
#include "drop_simulator.p4"
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

control Ingress(inout headers_t hdr,
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

    IngressDropSimulator() drop_simulator;
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

            // Checks, in pipeline.Pipeline.process order.
            if (meta.drop_reason == NO_DROP) {
                if (!hdr.ina.isValid()) {
                    // standard_metadata.parser_error is PacketTooShort (parsers.p4).
                    meta.drop_reason = DROP_TRUNCATED;
                } else if (hdr.ina.version != PROTOCOL_VERSION
                           || hdr.ina.ptype != PTYPE_DATA) {
                    meta.drop_reason = DROP_MALFORMED;
                }
            }
            if (meta.drop_reason == NO_DROP) {
                jobs.apply(hdr, meta);           // DROP_UNKNOWN_JOB, DROP_BAD_RANK
            }
            if (meta.drop_reason == NO_DROP) {
                workers.apply(hdr, meta);        // DROP_BAD_SOURCE
            }
            if (meta.drop_reason == NO_DROP) {
                if ((bit<32>)hdr.ina.slot >= meta.slot_count) {
                    meta.drop_reason = DROP_BAD_SLOT;
                } else if ((bit<32>)hdr.ina.num_lanes != LANES_PER_PACKET) {
                    meta.drop_reason = DROP_BAD_LANES;
                } else if (!hdr.ina_data.isValid()
                           || (bit<32>)hdr.udp.length != UDP_HEADER_BYTES + INA_PAYLOAD_BYTES
                           || (bit<32>)hdr.ipv4.total_len
                              != IPV4_HEADER_BYTES + UDP_HEADER_BYTES + INA_PAYLOAD_BYTES) {
                    meta.drop_reason = DROP_BAD_LENGTH;
                }
            }

            // Step 1: the use the (set, slot) holds; stale packets stop here.
            if (meta.drop_reason == NO_DROP) {
                meta.slot = meta.slot_base + (bit<32>)hdr.ina.slot;
                meta.index = (bit<32>)hdr.ina.pool_set * SWITCH_SLOTS + meta.slot;
                seq.read(meta.stored_seq, meta.index);
                remaining.read(meta.remaining, meta.index);
                seq_check.apply(hdr, meta);      // DROP_STALE, or meta.answer
            }

            // Steps 2 and 3: bitmaps, then a new contribution writes or adds.
            if (meta.drop_reason == NO_DROP && meta.answer == 0) {
                bitmap.apply(hdr, meta);
                if (meta.seen == 1) {
                    ina_stats.count(STAT_DUPLICATES_IGNORED);
                } else {
                    workers_counter.apply(meta);
                    remaining.write(meta.index, meta.remaining);
                    if (meta.first == 1) {
                        seq.write(meta.index, hdr.ina.seq);
                    }
                    ina_stats.count(STAT_AGGREGATED);
                    if (meta.complete == 1) {
                        ina_stats.count(STAT_COMPLETED);
                    }
                }
            }
            if (meta.answer == 1) {
                ina_stats.count(STAT_RETRANSMITS_ANSWERED);
                meta.lane_op = LANE_OP_READ;
            }
            if (meta.lane_op != LANE_OP_NONE) {
                exponents.apply(hdr, meta);
                values.apply(hdr, meta);
            }

            // Step 4: multicast a completed slot, answer a retransmission, or consume.
            if (meta.drop_reason == NO_DROP) {
                next_step.apply(hdr, meta, standard_metadata);
            } else {
                drops.count(meta.drop_reason);
                mark_to_drop(standard_metadata);
            }
        }
    }
}

control Egress(inout headers_t hdr,
               inout metadata_t meta,
               inout standard_metadata_t standard_metadata) {
    // Same indices as Ingress's: egress counts STAT_RESULTS_SENT and DROP_SIM_EGRESS.
    @id(0x12020001) @name(".Egress.ina_stats")
    counter(NUM_STATS, CounterType.packets) ina_stats;
    @id(0x12020002) @name(".Egress.drops")
    counter(NUM_DROP_REASONS, CounterType.packets) drops;

    Replicas() replicas;
    EgressDropSimulator() drop_simulator;

    apply {
        if (meta.result == 1) {
            if (meta.multicast == 1) {
                replicas.apply(hdr, meta, standard_metadata);
            }
            if (meta.no_replica == 1) {
                mark_to_drop(standard_metadata);
            } else {
                drop_simulator.apply(meta);      // DROP_SIM_EGRESS, per replica
                if (meta.drop_reason == DROP_SIM_EGRESS) {
                    drops.count(DROP_SIM_EGRESS);
                    mark_to_drop(standard_metadata);
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
         VerifyChecksum(),
         Ingress(),
         Egress(),
         ComputeChecksum(),
         Deparser()) main;
