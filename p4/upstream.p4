/* upstream.p4: Upstream, the table that makes this switch a leaf of hierarchical
 * aggregation (SwitchML/CollNet's "reduce near, aggregate across") for a job.
 *
 * One entry per job aggregated in two levels: the leaf's rank in the upstream (spine)
 * switch's job of the same id, and the spine's INA address (IPv4, UDP port, MAC) and
 * the egress port toward it. For such a job:
 *   - a completed slot is not multicast: the packet, still DATA, carries the partial sum
 *     to the spine as that rank (ina.p4 sets meta.send_up, next_step.p4 addresses it);
 *   - a RESULT is accepted only from the spine's address (IPv4 source, UDP source port),
 *     for the use the slot holds, finished here: it is written into the slot, marks it
 *     final and is multicast to the local workers; a copy arriving when the slot is
 *     final already is ignored (duplicates_ignored);
 *   - a local retransmission of a finished use whose result has not come back (the
 *     slot's `final` register is 0) sends the partial up again.
 * For every other job the table misses and nothing changes: a RESULT is malformed.
 * Applied once, to every INA packet that passed the version check.
 * Controller: controller/upstream.py.
 */
#ifndef _INA_UPSTREAM_P4_
#define _INA_UPSTREAM_P4_

control Upstream(in headers_t hdr, inout metadata_t meta) {
    @id(0x010B0001) @name(".Ingress.upstream.set_upstream")
    action set_upstream(bit<8> rank, ipv4_addr_t dst_ip, l4_port_t dst_port,
                        mac_addr_t dst_mac, port_t egress_port) {
        meta.has_upstream = 1;
        meta.upstream_rank = rank;
        meta.upstream_ip = dst_ip;
        meta.upstream_udp_port = dst_port;
        meta.upstream_mac = dst_mac;
        meta.upstream_port = egress_port;
    }

    @id(0x010B0002) @name(".Ingress.upstream.upstream_miss")
    action upstream_miss() {
        meta.has_upstream = 0;
    }

    @id(0x020B0001) @name(".Ingress.upstream.upstream")
    table upstream {
        key = {
            hdr.ina.job_id: exact @name("job_id");
        }
        actions = {
            set_upstream;
            @defaultonly upstream_miss;
        }
        const default_action = upstream_miss();
        size = UPSTREAM_TABLE_SIZE;
    }

    apply {
        upstream.apply();
    }
}

#endif  // _INA_UPSTREAM_P4_
