/* tna/jobs.p4: TnaJobs, the job table (../jobs.p4's entries, the same action and
 * parameters, so the controller writes both programs alike).
 *
 * Its action also computes the slot in the pool: slot_base + pool_index, whose bit 15
 * stays the set (the controller keeps slot_base + slot_count <= TNA_SWITCH_SLOTS). The
 * range check is ina_tna.p4's (slot_diff, stage 1); the rank check needs the worker count
 * and the rank as a match key: masks.p4.
 */
#ifndef _INA_TNA_JOBS_P4_
#define _INA_TNA_JOBS_P4_

control TnaJobs(in tna_headers_t hdr, inout tna_ingress_metadata_t meta) {
    @name(".Ingress.jobs.set_job")
    action set_job(bit<8> num_workers, bit<16> slot_base, bit<16> slot_count,
                   mcast_group_t mgid) {
        meta.job_hit = 1;
        meta.num_workers = num_workers;
        meta.abs_slot = slot_base + hdr.ina.pool_index;
        meta.slot_count = slot_count;
        meta.slot = hdr.ina.pool_index & SLOT_MASK;
        meta.mgid = mgid;
    }

    @name(".Ingress.jobs.job_miss")
    action job_miss() {
        meta.job_hit = 0;
    }

    @name(".Ingress.jobs.jobs")
    table jobs {
        key = {
            hdr.ina.job_id: exact @name("job_id");
        }
        actions = {
            set_job;
            @defaultonly job_miss;
        }
        const default_action = job_miss();
        size = TNA_JOB_TABLE_SIZE;
    }

    apply {
        jobs.apply();
    }
}

#endif  // _INA_TNA_JOBS_P4_
