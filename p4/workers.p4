/* workers.p4: Workers, the binding of each (job, rank) to its source address:port.
 *
 * SwitchML derives the worker from a match on addresses; here the packet names its
 * rank and this table checks that the rank belongs to the sender, so a stray or
 * spoofed packet cannot set another worker's bit. Drop: DROP_BAD_SOURCE (miss).
 * Applied to DATA packets; a RESULT from the upstream switch (upstream.p4) is checked
 * against the upstream entry's address in ina.p4 instead.
 * Controller: controller/workers.py, one entry per (job, rank).
 */
#ifndef _INA_WORKERS_P4_
#define _INA_WORKERS_P4_

control Workers(in headers_t hdr, inout metadata_t meta) {
    @id(0x01040001) @name(".Ingress.workers.worker_hit")
    action worker_hit() {
        meta.worker_bit = (bit<32>)1 << hdr.ina.rank;
    }

    @id(0x01040002) @name(".Ingress.workers.worker_miss")
    action worker_miss() {
        meta.drop_reason = DROP_BAD_SOURCE;
    }

    @id(0x02040001) @name(".Ingress.workers.workers")
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
        size = WORKER_TABLE_SIZE;
    }

    apply {
        workers.apply();
    }
}

#endif  // _INA_WORKERS_P4_
