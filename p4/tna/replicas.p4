/* tna/replicas.p4: TnaReplicas, the destination of each replica of a multicast result
 * (../replicas.p4: the same key, actions and parameters). The job's multicast group
 * holds one replica per worker, rid = its rank (egress_rid here); a miss drops the
 * replica uncounted.
 */
#ifndef _INA_TNA_REPLICAS_P4_
#define _INA_TNA_REPLICAS_P4_

control TnaReplicas(inout tna_headers_t hdr,
                    inout tna_egress_metadata_t meta,
                    in egress_intrinsic_metadata_t eg_intr_md) {
    @name(".Egress.replicas.set_destination")
    action set_destination(mac_addr_t dst_mac, ipv4_addr_t dst_ip, l4_port_t dst_port) {
        hdr.ethernet.dst_addr = dst_mac;
        hdr.ipv4.dst_addr = dst_ip;
        hdr.udp.dst_port = dst_port;
    }

    @name(".Egress.replicas.replica_miss")
    action replica_miss() {
        meta.no_replica = 1;
    }

    @name(".Egress.replicas.replicas")
    table replicas {
        key = {
            hdr.ina.job_id: exact @name("job_id");
            eg_intr_md.egress_rid: exact @name("egress_rid");
            eg_intr_md.egress_port: exact @name("egress_port");
        }
        actions = {
            set_destination;
            @defaultonly replica_miss;
        }
        const default_action = replica_miss();
        size = TNA_REPLICA_TABLE_SIZE;
    }

    apply {
        replicas.apply();
    }
}

#endif  // _INA_TNA_REPLICAS_P4_
