/* next_step.p4: NextStep, what becomes of a packet that passed every check (SwitchML's
 * next_step_selector, without recirculation: bmv2 handles 64 lanes in one pass).
 *
 *   - a DATA packet the switch does not aggregate (meta.to_fallback, sharing.p4): it
 *     goes on, unchanged (header and lanes as received), by unicast to the job's
 *     fallback aggregator;
 *   - partial sum for the upstream switch (meta.send_up: a completed slot, or a local
 *     retransmission before the spine's result came, of a job in upstream.p4): the
 *     packet stays DATA and goes by unicast to the spine, as the leaf's rank there;
 *   - completed slot (meta.complete), or the spine's first RESULT for the slot
 *     (meta.take_result): the packet becomes the RESULT and is multicast to the job's
 *     group (set_job's mgid); replicas.p4 sets each replica's destination; a RESULT of
 *     the job's fallback aggregator (meta.from_fallback) likewise, its header and lanes
 *     as received;
 *   - retransmission of a finished use (meta.answer): the RESULT goes back out of the
 *     ingress port to the sender alone;
 *   - otherwise (a contribution that did not complete the slot, a duplicate, or another
 *     copy of the spine's RESULT): the packet is consumed.
 * A RESULT is the packet's own header with ptype = RESULT, the slot's exponent and
 * values (exponents.p4, values.p4); job_id, pool_index, num_lanes and seq are the
 * worker's. Source and destination swap at every layer: the result comes from the
 * address the worker sent to (the switch's), to the sender; a replica's destination
 * is then rewritten in egress. The partial sum sent up likewise comes from the address
 * the worker sent to, UDP port INA_UDP_PORT, so the spine's result comes back to it as
 * INA; its destination is the upstream entry's. A packet for the fallback leaves the
 * same way to the fallback entry's address, so the fallback's RESULT comes back to this
 * switch. The UDP checksum is 0 ("none" over IPv4).
 */
#ifndef _INA_NEXT_STEP_P4_
#define _INA_NEXT_STEP_P4_

control NextStep(inout headers_t hdr,
                 inout metadata_t meta,
                 inout standard_metadata_t standard_metadata) {
    apply {
        if (meta.to_fallback == 1) {
            hdr.ethernet.src_addr = hdr.ethernet.dst_addr;
            hdr.ethernet.dst_addr = meta.fallback_mac;
            hdr.ipv4.src_addr = hdr.ipv4.dst_addr;
            hdr.ipv4.dst_addr = meta.fallback_ip;
            hdr.udp.src_port = INA_UDP_PORT;
            hdr.udp.dst_port = meta.fallback_udp_port;
            hdr.udp.checksum = 0;
            standard_metadata.egress_spec = meta.fallback_port;
        } else if (meta.send_up == 1) {
            hdr.ethernet.src_addr = hdr.ethernet.dst_addr;
            hdr.ethernet.dst_addr = meta.upstream_mac;
            hdr.ipv4.src_addr = hdr.ipv4.dst_addr;
            hdr.ipv4.dst_addr = meta.upstream_ip;
            hdr.udp.src_port = INA_UDP_PORT;
            hdr.udp.dst_port = meta.upstream_udp_port;
            hdr.udp.checksum = 0;
            hdr.ina.ptype = PTYPE_DATA;
            hdr.ina.rank = meta.upstream_rank;
            standard_metadata.egress_spec = meta.upstream_port;
            meta.upward = 1;
        } else if (meta.answer == 1 || meta.complete == 1 || meta.take_result == 1
                   || meta.from_fallback == 1) {
            mac_addr_t mac = hdr.ethernet.src_addr;
            hdr.ethernet.src_addr = hdr.ethernet.dst_addr;
            hdr.ethernet.dst_addr = mac;
            ipv4_addr_t ip = hdr.ipv4.src_addr;
            hdr.ipv4.src_addr = hdr.ipv4.dst_addr;
            hdr.ipv4.dst_addr = ip;
            l4_port_t udp_port = hdr.udp.src_port;
            hdr.udp.src_port = hdr.udp.dst_port;
            hdr.udp.dst_port = udp_port;
            hdr.udp.checksum = 0;
            hdr.ina.ptype = PTYPE_RESULT;
            meta.result = 1;
            if (meta.answer == 1) {
                standard_metadata.egress_spec = standard_metadata.ingress_port;
            } else {
                standard_metadata.mcast_grp = meta.mgid;
                meta.multicast = 1;
            }
        } else {
            mark_to_drop(standard_metadata);
        }
    }
}

#endif  // _INA_NEXT_STEP_P4_
