/* tna/results.p4: TnaResults, step 4: where a packet that passed every check goes
 * (../next_step.p4's addressing, after next_step.p4 here has decided):
 *   - up: a completed slot of a job with an upstream switch, or a local retransmission
 *     before the upstream's result came (`final` 0): the partial sum, still DATA, by
 *     unicast to the upstream switch as the leaf's rank there;
 *   - to the group: a completed slot, or the upstream's first RESULT: multicast;
 *   - to the sender: a finished use's retransmission: the result by unicast;
 *   - to the fallback (sharing.p4): a DATA packet the switch does not aggregate, as it
 *     came; the fallback's RESULT goes to the group, as it came;
 *   - otherwise consumed.
 * A RESULT's source is the address the worker sent to; egress rewrites each replica's
 * destination (replicas.p4) and the IPv4 checksum (parsers.p4).
 */
#ifndef _INA_TNA_RESULTS_P4_
#define _INA_TNA_RESULTS_P4_

control TnaResults(inout tna_headers_t hdr,
                   inout tna_ingress_metadata_t meta,
                   in ingress_intrinsic_metadata_t ig_intr_md,
                   inout ingress_intrinsic_metadata_for_tm_t ig_tm_md,
                   inout ingress_intrinsic_metadata_for_deparser_t ig_dprsr_md) {
    action swap_addresses() {
        mac_addr_t mac = hdr.ethernet.src_addr;
        hdr.ethernet.src_addr = hdr.ethernet.dst_addr;
        hdr.ethernet.dst_addr = mac;
        ipv4_addr_t ip = hdr.ipv4.src_addr;
        hdr.ipv4.src_addr = hdr.ipv4.dst_addr;
        hdr.ipv4.dst_addr = ip;
        l4_port_t port = hdr.udp.src_port;
        hdr.udp.src_port = hdr.udp.dst_port;
        hdr.udp.dst_port = port;
        hdr.udp.checksum = 0;
        hdr.ina.ptype = PTYPE_RESULT;
        hdr.bridge.result = 1;
    }

    @name(".Ingress.results.to_upstream")
    action to_upstream() {
        hdr.ethernet.src_addr = hdr.ethernet.dst_addr;
        hdr.ethernet.dst_addr = meta.upstream_mac;
        hdr.ipv4.src_addr = hdr.ipv4.dst_addr;
        hdr.ipv4.dst_addr = meta.upstream_ip;
        hdr.udp.src_port = INA_UDP_PORT;
        hdr.udp.dst_port = meta.upstream_udp_port;
        hdr.udp.checksum = 0;
        hdr.ina.ptype = PTYPE_DATA;
        hdr.ina.rank = meta.upstream_rank;
        ig_tm_md.ucast_egress_port = meta.upstream_port;
        hdr.bridge.upward = 1;
    }

    // sharing.p4: the DATA packet, unchanged, to the job's fallback aggregator, from the
    // address the worker sent to (the fallback's RESULT comes back here).
    @name(".Ingress.results.to_fallback")
    action to_fallback() {
        hdr.ethernet.src_addr = hdr.ethernet.dst_addr;
        hdr.ethernet.dst_addr = meta.fallback_mac;
        hdr.ipv4.src_addr = hdr.ipv4.dst_addr;
        hdr.ipv4.dst_addr = meta.fallback_ip;
        hdr.udp.src_port = INA_UDP_PORT;
        hdr.udp.dst_port = meta.fallback_udp_port;
        hdr.udp.checksum = 0;
        ig_tm_md.ucast_egress_port = meta.fallback_port;
        hdr.bridge.upward = 1;
        hdr.bridge.fallback = 1;
        hdr.bridge.fallback_stats = meta.fallback_stats;
    }

    @name(".Ingress.results.to_group")
    action to_group() {
        swap_addresses();
        ig_tm_md.mcast_grp_a = meta.mgid;
        hdr.bridge.multicast = 1;
    }

    @name(".Ingress.results.to_sender")
    action to_sender() {
        swap_addresses();
        ig_tm_md.ucast_egress_port = ig_intr_md.ingress_port;
    }

    @name(".Ingress.results.consume")
    action consume() {
        ig_dprsr_md.drop_ctl = 1;
    }

    apply {
        if (meta.to_fallback == 1) {
            to_fallback();
        } else if (meta.from_fallback == 1) {
            to_group();                         // the fallback's RESULT, as it came
        } else if (meta.answer == 1) {
            if (meta.has_upstream == 1 && meta.was_final == 0) {
                meta.stat = (bit<8>)STAT_UPSTREAM_RESENT;
                to_upstream();
            } else {
                to_sender();
            }
        } else if (meta.complete == 1) {
            if (meta.has_upstream == 1) {
                to_upstream();
            } else {
                to_group();
            }
        } else if (meta.take_result == 1) {
            if (meta.lane_op == (bit<8>)LANE_OP_WRITE) {
                to_group();
            } else {
                meta.stat = (bit<8>)STAT_DUPLICATES_IGNORED;
                consume();
            }
        } else {
            consume();
        }
    }
}

#endif  // _INA_TNA_RESULTS_P4_
