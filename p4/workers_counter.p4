/* workers_counter.p4: WorkersCounter, step 3 of the slot algorithm (SwitchML's
 * workers_counter), for a contribution the bitmaps did not find seen.
 *
 * meta.remaining holds the slot's down-counter as read in ina.p4:
 *   - 0: the packet starts a new use, the first contribution: the counter becomes
 *     workers - 1 and the lanes, exponent and seq are written (LANE_OP_WRITE);
 *   - otherwise: one contribution less to wait for; lanes add, exponents max
 *     (LANE_OP_ADD).
 * Reaching 0 completes the slot (at once for a one-worker job): meta.complete = 1.
 * ina.p4 writes meta.remaining (and, on a first contribution, the seq) back.
 */
#ifndef _INA_WORKERS_COUNTER_P4_
#define _INA_WORKERS_COUNTER_P4_

control WorkersCounter(inout metadata_t meta) {
    apply {
        if (meta.remaining == 0) {
            meta.first = 1;
            meta.remaining = meta.num_workers - 1;
            meta.lane_op = LANE_OP_WRITE;
        } else {
            meta.remaining = meta.remaining - 1;
            meta.lane_op = LANE_OP_ADD;
        }
        if (meta.remaining == 0) {
            meta.complete = 1;
        }
    }
}

#endif  // _INA_WORKERS_COUNTER_P4_
