/* tna/next_step.p4: TnaNextStep, step 3 of the slot algorithm: what the slot's missing
 * workers before this packet (checks.p4) make of it, and the slot's `final` register
 * (1: it holds the upstream switch's result, upstream.p4).
 *
 * One constant ternary table, `next_step` (entries in next_step_entries.p4, generated:
 * one pair per rank, since "the sender's bit" is a match on the rank), decides:
 *   join,  nothing missing       a finished use's retransmission: read the result
 *                                (with an upstream switch: read `final` too; answer if
 *                                1, send the partial sum up again if 0)
 *   join,  sender's bit clear    duplicate: ignored (a shared slot's retransmission,
 *                                with a fallback: passed on to it, sharing.p4)
 *   join,  only the sender's bit the last contribution: add, the slot completes
 *   join,  otherwise             add
 *   peek,  nothing missing       the slot is free: resubmit, the seq advances in pass 2
 *   peek,  otherwise             a use in progress: stale
 *   start                        the first contribution: write; `final` cleared; with
 *                                one worker the slot completes at once
 *   restart                      the same, in a loose slot taken over (sharing.p4)
 *   take,  nothing missing       the upstream switch's RESULT: set `final`; if it was
 *                                clear, write the lanes and multicast, else a duplicate
 *                                (the lanes keep the first copy)
 *   take,  otherwise             stale
 */
#ifndef _INA_TNA_NEXT_STEP_P4_
#define _INA_TNA_NEXT_STEP_P4_

control TnaNextStep(in tna_headers_t hdr, inout tna_ingress_metadata_t meta) {
    @name(".Ingress.final")
    Register<bit<8>, tna_index_t>(TNA_REGISTER_SIZE, 0) final;

    RegisterAction<bit<8>, tna_index_t, bit<8>>(final) final_read = {
        void apply(inout bit<8> value, out bit<8> before) {
            before = value;
        }
    };

    RegisterAction<bit<8>, tna_index_t, bit<8>>(final) final_clear = {
        void apply(inout bit<8> value, out bit<8> before) {
            before = value;
            value = 0;
        }
    };

    // The upstream's RESULT: the slot becomes final, and the lanes take the RESULT only
    // if it was not final already (a later copy is a duplicate, stored nowhere). The
    // answer is the lanes' operation itself, so the stages after need no gateway on it.
    RegisterAction<bit<8>, tna_index_t, bit<8>>(final) final_take = {
        void apply(inout bit<8> value, out bit<8> lane_op) {
            if (value == 0) {
                lane_op = (bit<8>)LANE_OP_WRITE;
            } else {
                lane_op = (bit<8>)LANE_OP_NONE;
            }
            value = 1;
        }
    };

    @name(".Ingress.next_step.answer")
    action answer() {
        meta.answer = 1;
        meta.lane_op = (bit<8>)LANE_OP_READ;
        meta.stat = (bit<8>)STAT_RETRANSMITS_ANSWERED;
    }

    @name(".Ingress.next_step.answer_upstream")
    action answer_upstream() {
        meta.answer = 1;
        meta.lane_op = (bit<8>)LANE_OP_READ;
        meta.stat = (bit<8>)STAT_RETRANSMITS_ANSWERED;
        meta.was_final = final_read.execute(meta.index);
    }

    @name(".Ingress.next_step.duplicate")
    action duplicate() {
        meta.stat = (bit<8>)STAT_DUPLICATES_IGNORED;
    }

    @name(".Ingress.next_step.duplicate_fallback")
    action duplicate_fallback() {
        meta.to_fallback = 1;
    }

    @name(".Ingress.next_step.add")
    action add() {
        meta.lane_op = (bit<8>)LANE_OP_ADD;
        meta.stat = (bit<8>)STAT_AGGREGATED;
    }

    @name(".Ingress.next_step.add_complete")
    action add_complete() {
        meta.lane_op = (bit<8>)LANE_OP_ADD;
        meta.stat = (bit<8>)STAT_AGGREGATED;
        meta.complete = 1;
    }

    @name(".Ingress.next_step.resubmit")
    action resubmit() {
        meta.resubmit = 1;
    }

    @name(".Ingress.next_step.stale")
    action stale() {
        meta.drop_reason = (bit<8>)DROP_STALE;
    }

    @name(".Ingress.next_step.first")
    action first() {
        meta.lane_op = (bit<8>)LANE_OP_WRITE;
        meta.stat = (bit<8>)STAT_AGGREGATED;
        meta.was_final = final_clear.execute(meta.index);
    }

    @name(".Ingress.next_step.first_complete")
    action first_complete() {
        meta.lane_op = (bit<8>)LANE_OP_WRITE;
        meta.stat = (bit<8>)STAT_AGGREGATED;
        meta.complete = 1;
        meta.was_final = final_clear.execute(meta.index);
    }

    @name(".Ingress.next_step.take_result")
    action take_result() {
        meta.take_result = 1;
        meta.stat = (bit<8>)STAT_RESULTS_FROM_UPSTREAM;
        meta.lane_op = final_take.execute(meta.index);
    }

    @name(".Ingress.next_step.next_step")
    table next_step {
        key = {
            meta.mode: ternary @name("mode");
            meta.missing: ternary @name("missing");
            hdr.ina.rank: ternary @name("rank");
            meta.has_upstream: ternary @name("has_upstream");
            meta.num_workers: ternary @name("num_workers");
            meta.resend_join: ternary @name("resend_join");
        }
        actions = {
            answer;
            answer_upstream;
            duplicate;
            duplicate_fallback;
            add;
            add_complete;
            resubmit;
            stale;
            first;
            first_complete;
            take_result;
        }
        const entries = {
#include "next_step_entries.p4"
        }
        const default_action = stale();
        size = 128;
    }

    apply {
        next_step.apply();
    }
}

#endif  // _INA_TNA_NEXT_STEP_P4_
