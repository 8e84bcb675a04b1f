/* replicas.p4: Replicas, the egress rewrite of each replica of a multicast result
 * (SwitchML keys its egress sender tables on the replica the same way).
 *
 * The job's multicast group holds one replica per worker: (the worker's port, rid =
 * its rank). The key (job_id, egress_rid, egress_port) names one worker of one job;
 * set_destination writes its MAC, IPv4 address and UDP port as the destination. The
 * source is already the switch's address the worker sent to (next_step.p4 swapped
 * it). A miss (a group member without a replica entry) drops the replica uncounted:
 * the controller writes both together.
 * Controller: controller/replicas.py.
 */
#ifndef _INA_REPLICAS_P4_
#define _INA_REPLICAS_P4_

control Replicas(inout headers_t hdr,
                 inout metadata_t meta,
                 in standard_metadata_t standard_metadata) {
    @id(0x010A0001) @name(".Egress.replicas.set_destination")
    action set_destination(mac_addr_t dst_mac, ipv4_addr_t dst_ip, l4_port_t dst_port) {
        hdr.ethernet.dst_addr = dst_mac;
        hdr.ipv4.dst_addr = dst_ip;
        hdr.udp.dst_port = dst_port;
    }

    @id(0x010A0002) @name(".Egress.replicas.replica_miss")
    action replica_miss() {
        meta.no_replica = 1;
    }

    @id(0x020A0001) @name(".Egress.replicas.replicas")
    table replicas {
        key = {
            hdr.ina.job_id: exact @name("job_id");
            standard_metadata.egress_rid: exact @name("egress_rid");
            standard_metadata.egress_port: exact @name("egress_port");
        }
        actions = {
            set_destination;
            @defaultonly replica_miss;
        }
        const default_action = replica_miss();
        size = REPLICA_TABLE_SIZE;
    }

    apply {
        replicas.apply();
    }
}

#endif  // _INA_REPLICAS_P4_
