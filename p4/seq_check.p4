/* seq_check.p4: SeqCheck, step 1 of the slot algorithm (docs/protocol.md), before
 * anything of the slot is written.
 *
 * Reads meta.stored_seq and meta.remaining: the seq of the use the (set, slot) holds
 * (0: unused) and its down-counter (0: idle or finished). Both registers live in
 * ina.p4 because they are read here and written after the bitmaps (bitmap.p4), and a
 * register cannot be shared between two controls. Outcome for a DATA packet:
 *   - the packet's seq is the stored one and the slot holds a use:
 *       finished (remaining 0): meta.answer = 1, the stored result goes back by unicast
 *         whatever the sender's bitmap bit (its next use may have cleared it); but for a
 *         job with an upstream switch whose result the slot does not hold yet
 *         (meta.is_final 0, upstream.p4), meta.resend_up = 1: the partial sum goes up
 *         again, since it or the spine's result may have been lost;
 *       in progress: on to the bitmaps;
 *   - otherwise a seq older than the stored one (serial-number order: bit 31 of seq -
 *     stored): DROP_STALE;
 *   - otherwise a use in progress (remaining != 0) in an ordinary slot: DROP_STALE;
 *   - otherwise a new use starts (a newer seq on a finished slot, or an unused slot).
 * A loose slot (meta.loose, sharing.p4: a shared slot, or any slot of a job this switch
 * serves as a fallback) may see its uses run at another place, so there a new use takes
 * the slot over even while another is in progress (that use finished at the other
 * place), and every new use starts with a clear bitmap in its set (meta.restart, read by
 * bitmap.p4) and remaining 0 (a first contribution). But a retransmission (FLAG_RESEND)
 * that would start a use in a shared slot goes to the job's fallback if it has one
 * (meta.to_fallback): the use may have run, or finished, there.
 * A RESULT from the upstream switch (meta.from_upstream) belongs only to the use the
 * slot holds, finished here (its partial was sent up at completion): any other seq, an
 * unused slot or a use in progress is DROP_STALE.
 */
#ifndef _INA_SEQ_CHECK_P4_
#define _INA_SEQ_CHECK_P4_

control SeqCheck(in headers_t hdr, inout metadata_t meta) {
    apply {
        if (meta.from_upstream == 1) {
            if (hdr.ina.seq != meta.stored_seq || meta.stored_seq == 0
                    || meta.remaining != 0) {
                meta.drop_reason = DROP_STALE;
            }
        } else if (hdr.ina.seq == meta.stored_seq
                && (meta.stored_seq != 0 || meta.remaining != 0)) {
            if (meta.remaining == 0) {
                if (meta.has_upstream == 1 && meta.is_final == 0) {
                    meta.resend_up = 1;
                } else {
                    meta.answer = 1;
                }
            }
        } else if (meta.stored_seq != 0
                   && ((hdr.ina.seq - meta.stored_seq) & SEQ_OLDER_BIT) != 0) {
            meta.drop_reason = DROP_STALE;
        } else if (meta.remaining != 0 || meta.loose == 1) {
            if (meta.in_reservation == 0 && (hdr.ina.flags & FLAG_RESEND) != 0
                    && meta.has_fallback == 1) {
                meta.to_fallback = 1;
            } else if (meta.loose == 0) {
                meta.drop_reason = DROP_STALE;  // another use runs (remaining != 0)
            } else {
                meta.restart = 1;
                meta.remaining = 0;
            }
        }
    }
}

#endif  // _INA_SEQ_CHECK_P4_
