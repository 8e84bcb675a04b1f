/* tna/workers.p4: TnaWorkers, each (job, rank)'s source address:port (../workers.p4's
 * table: the same key and actions). A hit only says the binding exists; the sender's
 * bit comes from masks.p4, since Tofino's ALUs cannot shift by a field.
 */
#ifndef _INA_TNA_WORKERS_P4_
#define _INA_TNA_WORKERS_P4_

control TnaWorkers(in tna_headers_t hdr, inout tna_ingress_metadata_t meta) {
    @name(".Ingress.workers.worker_hit")
    action worker_hit() {
        meta.worker_hit = 1;
    }

    @name(".Ingress.workers.worker_miss")
    action worker_miss() {
        meta.worker_hit = 0;
    }

    @name(".Ingress.workers.workers")
    table workers {
        key = {
            hdr.ina.job_id: exact @name("job_id");
            hdr.ina.rank: exact @name("rank");
            hdr.ipv4.src_addr: exact @name("ipv4_src");
            hdr.udp.src_port: exact @name("udp_src_port");
        }
        actions = {
            worker_hit;
            @defaultonly worker_miss;
        }
        const default_action = worker_miss();
        size = TNA_WORKER_TABLE_SIZE;
    }

    apply {
        workers.apply();
    }
}

#endif  // _INA_TNA_WORKERS_P4_
