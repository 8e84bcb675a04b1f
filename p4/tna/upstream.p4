/* tna/upstream.p4: TnaUpstream, the leaf's entry for a job aggregated in two levels
 * (../upstream.p4's table: the same key, action and parameters).
 *
 * The action also XORs the entry's address with the packet's source: 0 in both means
 * the packet comes from the upstream switch (checks.p4 matches the differences, since a
 * Tofino gateway compares fields only with constants).
 */
#ifndef _INA_TNA_UPSTREAM_P4_
#define _INA_TNA_UPSTREAM_P4_

control TnaUpstream(in tna_headers_t hdr, inout tna_ingress_metadata_t meta) {
    @name(".Ingress.upstream.set_upstream")
    action set_upstream(bit<8> rank, ipv4_addr_t dst_ip, l4_port_t dst_port,
                        mac_addr_t dst_mac, PortId_t egress_port) {
        meta.has_upstream = 1;
        meta.upstream_rank = rank;
        meta.upstream_ip = dst_ip;
        meta.upstream_udp_port = dst_port;
        meta.upstream_mac = dst_mac;
        meta.upstream_port = egress_port;
        meta.upstream_ip_diff = dst_ip ^ hdr.ipv4.src_addr;
        meta.upstream_port_diff = dst_port ^ hdr.udp.src_port;
    }

    @name(".Ingress.upstream.upstream_miss")
    action upstream_miss() {
        meta.has_upstream = 0;
    }

    @name(".Ingress.upstream.upstream")
    table upstream {
        key = {
            hdr.ina.job_id: exact @name("job_id");
        }
        actions = {
            set_upstream;
            @defaultonly upstream_miss;
        }
        const default_action = upstream_miss();
        size = TNA_UPSTREAM_TABLE_SIZE;
    }

    apply {
        upstream.apply();
    }
}

#endif  // _INA_TNA_UPSTREAM_P4_
