/* forwarder.p4: Forwarder, L2 forwarding of ordinary traffic (SwitchML's forwarder),
 * so Gloo, ARP and anything not sent to INA_UDP_PORT cross the same switch.
 *
 * Exact match on the destination MAC: set_egress_port for a known host, flood(mgid)
 * to a multicast group of all host ports (the controller may make it the default
 * action, for ARP broadcasts; egress does not send a flooded copy back out of its
 * ingress port); the initial default drops.
 * Controller: controller/forwarder.py.
 */
#ifndef _INA_FORWARDER_P4_
#define _INA_FORWARDER_P4_

control Forwarder(in headers_t hdr,
                  inout metadata_t meta,
                  inout standard_metadata_t standard_metadata) {
    @id(0x01090001) @name(".Ingress.forwarder.set_egress_port")
    action set_egress_port(port_t port) {
        standard_metadata.egress_spec = port;
    }

    @id(0x01090002) @name(".Ingress.forwarder.flood")
    action flood(mcast_group_t mgid) {
        standard_metadata.mcast_grp = mgid;
        meta.flooded = 1;
    }

    @id(0x01090003) @name(".Ingress.forwarder.forward_drop")
    action forward_drop() {
        mark_to_drop(standard_metadata);
    }

    @id(0x02090001) @name(".Ingress.forwarder.forward")
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
        size = FORWARD_TABLE_SIZE;
    }

    apply {
        forward.apply();
    }
}

#endif  // _INA_FORWARDER_P4_
