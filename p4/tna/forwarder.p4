/* tna/forwarder.p4: TnaForwarder, L2 forwarding of ordinary traffic (Gloo, ARP), as
 * ../forwarder.p4: the same table, actions and parameters. A flooded frame is marked in
 * the bridge header; egress drops the copy that would leave by its ingress port.
 */
#ifndef _INA_TNA_FORWARDER_P4_
#define _INA_TNA_FORWARDER_P4_

control TnaForwarder(inout tna_headers_t hdr,
                     inout ingress_intrinsic_metadata_for_tm_t ig_tm_md,
                     inout ingress_intrinsic_metadata_for_deparser_t ig_dprsr_md) {
    @name(".Ingress.forwarder.set_egress_port")
    action set_egress_port(PortId_t port) {
        ig_tm_md.ucast_egress_port = port;
    }

    @name(".Ingress.forwarder.flood")
    action flood(mcast_group_t mgid) {
        ig_tm_md.mcast_grp_a = mgid;
        hdr.bridge.flooded = 1;
    }

    @name(".Ingress.forwarder.forward_drop")
    action forward_drop() {
        ig_dprsr_md.drop_ctl = 1;
    }

    @name(".Ingress.forwarder.forward")
    table forward {
        key = {
            hdr.ethernet.dst_addr: exact @name("eth_dst");
        }
        actions = {
            set_egress_port;
            flood;
            forward_drop;
        }
        default_action = forward_drop();
        size = TNA_FORWARD_TABLE_SIZE;
    }

    apply {
        forward.apply();
    }
}

#endif  // _INA_TNA_FORWARDER_P4_
