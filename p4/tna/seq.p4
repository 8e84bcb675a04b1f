/* tna/seq.p4: TnaSeq, the seq of the use each (set, slot) holds (0: never used), the
 * first of the slot's three registers (then checks.p4's missing workers, then
 * next_step.p4's final flag).
 *
 * v1model reads seq and the down-counter, decides, and writes both; on Tofino a
 * register runs once per pass, in one stage, and its stateful ALU has two comparisons.
 * So the seq changes only when a use starts, and in a second pass:
 *   - pass 1 (check): seq_diff = seq - stored (serial-number order), or 1 for an unused
 *     slot. 0: the slot's use; 1..2^31-1: newer; otherwise older (DROP_STALE).
 *     A newer seq goes on to peek at the slot's missing workers (checks.p4): a slot
 *     whose use is finished is resubmitted (next_step.p4), one in progress is stale.
 *   - pass 2 (advance): if the seq is still newer (or the slot unused), it becomes the
 *     slot's and seq_diff = 1: the use starts (checks.p4 fills its missing workers).
 *     Otherwise seq_diff = seq - stored as in pass 1: another worker's first packet
 *     started this use in between (0: the packet joins it), or a newer use (stale).
 * A shared slot's first packet (sharing.p4) starts its use in pass 2, at its pool slot.
 */
#ifndef _INA_TNA_SEQ_P4_
#define _INA_TNA_SEQ_P4_

control TnaSeq(in tna_headers_t hdr, inout tna_ingress_metadata_t meta) {
    @name(".Ingress.seq")
    Register<bit<32>, tna_index_t>(TNA_REGISTER_SIZE, 0) seq;

    RegisterAction<bit<32>, tna_index_t, bit<32>>(seq) check = {
        void apply(inout bit<32> value, out bit<32> diff) {
            if (value == 0) {
                diff = 1;
            } else {
                diff = hdr.ina.seq - value;
            }
        }
    };

    RegisterAction<bit<32>, tna_index_t, bit<32>>(seq) advance = {
        void apply(inout bit<32> value, out bit<32> diff) {
            if (value == 0 || (int<32>)(hdr.ina.seq - value) > 0) {
                value = hdr.ina.seq;
                diff = 1;
            } else {
                diff = hdr.ina.seq - value;
            }
        }
    };

    // The (set, slot) register index; a shared slot's pass 2 (sharing.p4) has its pool
    // slot's in the resubmit data as the difference from the job's slot (0 otherwise),
    // which XOR16 (the two 16-bit words XORed) undoes.
    Hash<tna_index_t>(HashAlgorithm_t.XOR16) index;

    apply {
        // A retransmission in a shared slot with a fallback starts no use here.
        if (meta.second_pass == 1 && meta.shared_check == 0) {
            meta.seq_diff = advance.execute(index.get({2w0, meta.abs_slot[15:15], meta.abs_slot[12:0],
                                                       3w0, meta.resubmit_data.cell[12:0]}));
        } else {
            meta.seq_diff = check.execute(index.get({2w0, meta.abs_slot[15:15], meta.abs_slot[12:0],
                                                     3w0, meta.resubmit_data.cell[12:0]}));
        }
    }
}

#endif  // _INA_TNA_SEQ_P4_
