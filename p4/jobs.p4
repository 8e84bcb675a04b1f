/* jobs.p4: Jobs, the job table (ATP-style per-job isolation) and the rank check.
 *
 * One entry per installed job: its worker count, its range [slot_base, slot_base +
 * slot_count) of the switch pool and the multicast group of its workers. A packet's
 * slot is relative to its job, so a job can neither read nor disturb another's slots.
 * Drops: DROP_UNKNOWN_JOB (table miss), DROP_BAD_RANK (rank >= workers, DATA only).
 * slot_count may be 0: a job whose slots all lie in a shared region or at its fallback
 * aggregator (sharing.p4).
 * Controller: controller/jobs.py writes the entries.
 */
#ifndef _INA_JOBS_P4_
#define _INA_JOBS_P4_

control Jobs(in headers_t hdr, inout metadata_t meta) {
    @id(0x01030001) @name(".Ingress.jobs.set_job")
    action set_job(bit<8> num_workers, bit<16> slot_base, bit<16> slot_count,
                   mcast_group_t mgid) {
        meta.num_workers = (bit<32>)num_workers;
        meta.slot_base = (bit<32>)slot_base;
        meta.slot_count = (bit<32>)slot_count;
        meta.mgid = mgid;
    }

    @id(0x01030002) @name(".Ingress.jobs.job_miss")
    action job_miss() {
        meta.drop_reason = DROP_UNKNOWN_JOB;
    }

    @id(0x02030001) @name(".Ingress.jobs.jobs")
    table jobs {
        key = {
            hdr.ina.job_id: exact @name("job_id");
        }
        actions = {
            set_job;
            @defaultonly job_miss;
        }
        const default_action = job_miss();
        size = JOB_TABLE_SIZE;
    }

    apply {
        jobs.apply();
        // A RESULT from the upstream switch or the fallback aggregator carries the rank
        // of whichever packet made it there, not one of this job's: only a DATA
        // packet's rank is checked.
        if (meta.drop_reason == NO_DROP && meta.from_upstream == 0
                && meta.from_fallback == 0
                && (bit<32>)hdr.ina.rank >= meta.num_workers) {
            meta.drop_reason = DROP_BAD_RANK;
        }
    }
}

#endif  // _INA_JOBS_P4_
