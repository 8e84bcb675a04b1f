/* ina_tna.p4: the INA aggregation switch for Tofino 1 (TNA), the semantics of
 * ../ina.p4 (v1model) and of the soft switch's Pipeline.process in Tofino's terms.
 *
 * p4/README.md ("Tofino") gives the pass structure and the stage budget; each control's
 * file says what it does. A packet's way through ingress, by stage
 * (ina_tna.resources.txt):
 *   0-2  a RoCEv2 frame's lookups (roce.p4: its queue pair, job, message shape), the
 *        header checks (gateways), the drop simulator's draw (1: its decision)
 *   3-4  the RoCEv2 queue pair's state, which gives the INA packet its pool index, seq
 *        and exponent; jobs, workers, upstream
 *   5    masks (the sender's bit), seq (check, or advance in pass 2)
 *   6    checks: the first failing check, or what the packet does with its slot's
 *        missing-workers register (join, peek, start, take)
 *   7    next_step: the packet's fate from the slot's missing workers; the final flag
 *   8-11 values: the exponent, then the lanes (write, add, read), 4 a stage; results:
 *        where the packet goes, and the counters
 * A use's first packet is resubmitted once (seq.p4). Egress addresses each replica of a
 * multicast result, makes it an RDMA WRITE if its job came over RoCEv2
 * (roce_replies.p4), runs the egress drop simulator and counts what leaves.
 */
#include <core.p4>
#include <tna.p4>

#include "configuration.p4"
#include "headers.p4"
#include "parsers.p4"
#include "drop_simulator.p4"
#include "jobs.p4"
#include "workers.p4"
#include "upstream.p4"
#include "sharing.p4"
#include "masks.p4"
#include "seq.p4"
#include "checks.p4"
#include "next_step.p4"
#include "values.p4"
#include "results.p4"
#include "forwarder.p4"
#include "replicas.p4"
#include "roce.p4"
#include "roce_replies.p4"

@pa_auto_init_metadata
control InaIngress(inout tna_headers_t hdr,
                   inout tna_ingress_metadata_t meta,
                   in ingress_intrinsic_metadata_t ig_intr_md,
                   in ingress_intrinsic_metadata_from_parser_t ig_prsr_md,
                   inout ingress_intrinsic_metadata_for_deparser_t ig_dprsr_md,
                   inout ingress_intrinsic_metadata_for_tm_t ig_tm_md) {
    // STAT_RECEIVED and STAT_COMPLETED have counters of their own (a counter counts once
    // a pass); ina_stats counts each packet's outcome, indexed by STAT_*.
    @name(".Ingress.received")
    Counter<bit<64>, bit<1>>(1, CounterType_t.PACKETS) received;
    @name(".Ingress.completed")
    Counter<bit<64>, bit<1>>(1, CounterType_t.PACKETS) completed;
    @name(".Ingress.ina_stats")
    Counter<bit<64>, bit<8>>(NUM_STATS, CounterType_t.PACKETS) ina_stats;
    @name(".Ingress.drops")
    Counter<bit<64>, bit<8>>(NUM_DROP_REASONS, CounterType_t.PACKETS) drops;
    // sharing.p4's per-job counters, in the cell each entry names (stats).
    @name(".Ingress.sharing.shared_uses")
    Counter<bit<64>, bit<16>>(SHARING_STATS_SIZE, CounterType_t.PACKETS) shared_uses;
    @name(".Ingress.sharing.collisions")
    Counter<bit<64>, bit<16>>(SHARING_STATS_SIZE, CounterType_t.PACKETS) collisions;
    @name(".Ingress.sharing.from_fallback")
    Counter<bit<64>, bit<16>>(SHARING_STATS_SIZE, CounterType_t.PACKETS) from_fallback;

    Hash<tna_index_t>(HashAlgorithm_t.XOR16) index;

    TnaIngressDropSimulator() drop_simulator;
    TnaUpstream() upstream;
    TnaSharing() sharing;
    TnaOwner() owner;
    TnaJobs() jobs;
    TnaWorkers() workers;
    TnaMasks() masks;
    TnaSeq() seq;
    TnaChecks() checks;
    TnaNextStep() next_step;
    TnaValues() values;
    TnaResults() results;
    TnaForwarder() forwarder;
    TnaRoceRequests() roce_lookup;
    TnaRoceStep() roce_step;
    TnaRoceVerdict() roce_verdict;

    apply {
        hdr.bridge.setValid();
        hdr.bridge.ingress_port = ig_intr_md.ingress_port;
        meta.drop_reason = TNA_NO_DROP;
        if (meta.is_ina == 0) {
            forwarder.apply(hdr, ig_tm_md, ig_dprsr_md);
        } else {
            if (meta.second_pass == 0) {
                received.count(0);
            }
            // RoCEv2 -> the INA DATA packet (roce.p4): the lookups, then the queue pair's
            // step once the drop simulator let the packet in, which sets drop_reason.
            if (meta.is_roce == 1) {
                roce_lookup.apply(hdr, meta);
            }
            drop_simulator.apply(meta);
            if (meta.is_roce == 1) {
                roce_step.apply(hdr, meta);
            }
            if (hdr.ina.version == PROTOCOL_VERSION) {
                meta.version_ok = 1;
            }
            if (hdr.ina.ptype == PTYPE_DATA) {
                meta.is_data = 1;
            }
            if (hdr.ina.ptype == PTYPE_RESULT) {
                meta.is_result = 1;
            }
            if (hdr.ina.num_lanes == (bit<16>)TNA_LANES_PER_PACKET) {
                meta.lanes_ok = 1;
            }
            // roce.p4 checked a RoCEv2 frame's length (its headers differ).
            if (hdr.ina_data.isValid() && (meta.is_roce == 1
                    || (hdr.udp.length == (bit<16>)(UDP_HEADER_BYTES + TNA_PAYLOAD_BYTES)
                        && hdr.ipv4.total_len
                           == (bit<16>)(IPV4_HEADER_BYTES + UDP_HEADER_BYTES
                                        + TNA_PAYLOAD_BYTES)))) {
                meta.length_ok = 1;
            }
            upstream.apply(hdr, meta);
            sharing.apply(hdr, meta);
            jobs.apply(hdr, meta);
            workers.apply(hdr, meta);
            masks.apply(hdr, meta);
            // A slot past the reservation: its pool slot in the shared region and its
            // owner cell's value (sharing.p4), a step a stage. Each step is under a
            // condition the next is not: p4c would otherwise substitute a step's
            // expression into the next, an action of two steps, which no stage runs.
            if (meta.job_hit == 1) {
                meta.slot_diff = meta.slot - meta.slot_count;
                meta.slot_next = meta.slot + 1;
            }
            // Pass 1's check changes nothing, and pass 2 follows a pass 1 that dropped
            // nothing: seq need not wait for RoCEv2's verdict, the checks do.
            if (meta.job_hit == 1) {
                seq.apply(hdr, meta);
            }
            if (meta.has_shared == 1) {
                meta.shared_rel = meta.slot_diff + meta.shared_offset;
                meta.shared_left = meta.slot_diff - meta.shared_count;
                meta.owner_me = hdr.ina.job_id ++ meta.slot_next;
            }
            meta.index = index.get({2w0, meta.abs_slot[15:15], meta.abs_slot[12:0],
                                    3w0, meta.resubmit_data.cell[12:0]});   // seq.p4
            if (meta.is_roce == 1) {
                roce_verdict.apply(meta);       // DROP_BAD_PSN etc. (roce.p4)
            }
            if (meta.is_data == 1) {
                meta.shared_wrap = meta.shared_rel & meta.shared_mask;
            }
            if (meta.drop_reason == TNA_NO_DROP) {
                checks.apply(hdr, meta);
            }
            if (meta.mode != MODE_NONE) {
                next_step.apply(hdr, meta);
            }
            if (meta.has_shared == 1) {
                meta.cell = meta.shared_wrap | meta.shared_base;
            }
            values.apply(hdr, meta);
            // A shared slot's pass 1: the owner cell, or past the shared count.
            if (meta.place == 1) {
                meta.resubmit_data.cell = meta.cell ^ meta.abs_slot;
                if (meta.shared_left[15:15] == 1) {
                    owner.apply(meta);
                } else {
                    meta.resubmit_data.held = 2;
                }
            }
            if (meta.collision == 1) {
                collisions.count(meta.shared_stats);
            }
            if (meta.drop_reason != TNA_NO_DROP) {
                drops.count(meta.drop_reason);
                ig_dprsr_md.drop_ctl = 1;
            } else if (meta.resubmit == 1) {
                meta.resubmit_data.setValid();
                meta.resubmit_data.pass = TNA_PASS_SECOND;
                ig_dprsr_md.resubmit_type = 1;
            } else {
                results.apply(hdr, meta, ig_intr_md, ig_tm_md, ig_dprsr_md);
                // A packet to or from the fallback has no statistic of ina_stats (stat
                // 0, STAT_RECEIVED, is the received counter's): sharing.p4's count it.
                if (meta.stat != (bit<8>)STAT_RECEIVED) {
                    ina_stats.count(meta.stat);
                }
                if (meta.shared_use == 1) {
                    shared_uses.count(meta.shared_stats);
                }
                if (meta.from_fallback == 1) {
                    from_fallback.count(meta.fallback_stats);
                }
                if (meta.complete == 1) {
                    completed.count(0);
                }
            }
        }
    }
}

@pa_auto_init_metadata
control InaEgress(inout tna_headers_t hdr,
                  inout tna_egress_metadata_t meta,
                  in egress_intrinsic_metadata_t eg_intr_md,
                  in egress_intrinsic_metadata_from_parser_t eg_prsr_md,
                  inout egress_intrinsic_metadata_for_deparser_t eg_dprsr_md,
                  inout egress_intrinsic_metadata_for_output_port_t eg_oport_md) {
    // Egress counts STAT_RESULTS_SENT and STAT_SENT_UPSTREAM, and DROP_SIM_EGRESS.
    @name(".Egress.ina_stats")
    Counter<bit<64>, bit<8>>(NUM_STATS, CounterType_t.PACKETS) ina_stats;
    @name(".Egress.drops")
    Counter<bit<64>, bit<8>>(NUM_DROP_REASONS, CounterType_t.PACKETS) drops;
    @name(".Egress.sharing.to_fallback")
    Counter<bit<64>, bit<16>>(SHARING_STATS_SIZE, CounterType_t.PACKETS) to_fallback;

    TnaReplicas() replicas;
    TnaRoceEgress() roce;
    TnaEgressDropSimulator() drop_simulator;

    apply {
        if (hdr.bridge.result == 1 || hdr.bridge.upward == 1) {
            if (hdr.bridge.multicast == 1) {
                replicas.apply(hdr, meta, eg_intr_md);
            }
            if (hdr.bridge.roce == 1 && meta.no_replica == 0) {
                roce.apply(hdr, meta, eg_intr_md);  // the WRITE, its PSN taken
            }
            if (meta.no_replica == 1) {
                eg_dprsr_md.drop_ctl = 1;
            } else {
                drop_simulator.apply(meta);
                if (meta.sim_drop == 1) {
                    drops.count((bit<8>)DROP_SIM_EGRESS);
                    eg_dprsr_md.drop_ctl = 1;
                } else if (hdr.bridge.fallback == 1) {
                    to_fallback.count(hdr.bridge.fallback_stats);   // sharing.p4
                } else if (hdr.bridge.upward == 1) {
                    ina_stats.count((bit<8>)STAT_SENT_UPSTREAM);
                } else {
                    ina_stats.count((bit<8>)STAT_RESULTS_SENT);
                }
            }
        } else if (hdr.bridge.flooded == 1) {
            if (eg_intr_md.egress_port == hdr.bridge.ingress_port) {
                eg_dprsr_md.drop_ctl = 1;
            }
        }
    }
}

Pipeline(InaIngressParser(),
         InaIngress(),
         InaIngressDeparser(),
         InaEgressParser(),
         InaEgress(),
         InaEgressDeparser()) pipe;

Switch(pipe) main;
