/* tna/parsers.p4: the ingress and egress parsers and deparsers of the TNA program.
 *
 * Ingress parses what ../parsers.p4 parses (INA = UDP to INA_UDP_PORT over IPv4 without
 * options or fragments) after Tofino's intrinsic metadata, and the resubmit data of a
 * packet's second pass. A packet too short for the INA header or the lanes leaves the
 * header (or the lanes) invalid and goes on to ingress with parser_err set: ingress
 * counts it (DROP_TRUNCATED, DROP_BAD_LENGTH) as the soft switch does. RoCEv2 (UDP to
 * ROCE_UDP_PORT) is parsed as ../parsers.p4 parses it: BTH, the opcode's RETH and ImmDt,
 * the lanes, the ICRC; roce.p4 turns it into an INA packet, so ingress deparses INA and
 * the ICRC after the lanes. Egress parses the bridge header and the headers it rewrites
 * (not the lanes) and recomputes the IPv4 checksum of every INA packet it sends; a reply
 * to a RoCEv2 worker leaves with a BTH, RETH and ImmDt where the INA header was.
 */
#ifndef _INA_TNA_PARSERS_P4_
#define _INA_TNA_PARSERS_P4_

parser InaIngressParser(packet_in pkt,
                        out tna_headers_t hdr,
                        out tna_ingress_metadata_t meta,
                        out ingress_intrinsic_metadata_t ig_intr_md) {
    state start {
        pkt.extract(ig_intr_md);
        transition select(ig_intr_md.resubmit_flag) {
            1: parse_resubmit;
            default: parse_port_metadata;
        }
    }

    state parse_resubmit {
        pkt.extract(meta.resubmit_data);
        meta.second_pass = 1;
        transition select(meta.resubmit_data.shared, meta.resubmit_data.check) {
            (1, 0): parse_shared_pass;
            (1, 1): parse_shared_check;
            default: parse_ethernet;
        }
    }

    // A shared slot's pass 2 (sharing.p4).
    state parse_shared_pass {
        meta.shared_pass = 1;
        transition parse_ethernet;
    }

    state parse_shared_check {
        meta.shared_pass = 1;
        meta.shared_check = 1;
        transition parse_ethernet;
    }

    state parse_port_metadata {
        pkt.advance(PORT_METADATA_SIZE);
        // seq.p4's index reads the cell in every pass: 0 in pass 1, not whatever the
        // container holds (a header's fields are not metadata @pa_auto_init_metadata
        // clears).
        meta.resubmit_data.cell = 0;
        transition parse_ethernet;
    }

    state parse_ethernet {
        pkt.extract(hdr.ethernet);
        transition select(hdr.ethernet.ether_type) {
            ETHERTYPE_IPV4: parse_ipv4;
            default: accept;
        }
    }

    state parse_ipv4 {
        pkt.extract(hdr.ipv4);
        transition select(hdr.ipv4.ihl, hdr.ipv4.frag_offset, hdr.ipv4.protocol) {
            (4w5, 13w0, IP_PROTOCOL_UDP): parse_udp;
            default: accept;
        }
    }

    state parse_udp {
        pkt.extract(hdr.udp);
        transition select(hdr.udp.dst_port) {
            INA_UDP_PORT: parse_ina;
            ROCE_UDP_PORT: parse_bth;
            default: accept;
        }
    }

    // INA over RoCEv2 (roce.p4), as ../parsers.p4: the opcode says which headers follow;
    // each opcode's state also sets the UDP length its frame must have.
    state parse_bth {
        meta.is_ina = 1;
        meta.is_roce = 1;
        pkt.extract(hdr.bth);
        transition select(hdr.bth.opcode) {
            ROCE_WRITE_FIRST: roce_first;
            ROCE_WRITE_ONLY: roce_only;
            ROCE_WRITE_ONLY_IMM: roce_only_imm;
            ROCE_WRITE_MIDDLE: roce_middle;
            ROCE_WRITE_LAST: roce_last;
            ROCE_WRITE_LAST_IMM: roce_last_imm;
            default: accept;                    // DROP_MALFORMED (roce_opcode_ok 0)
        }
    }

    state roce_first {
        meta.roce_opcode_ok = 1;
        meta.roce_first = 1;
        transition parse_reth;
    }

    state roce_only {
        meta.roce_opcode_ok = 1;
        meta.roce_first = 1;
        meta.roce_last = 1;
        transition parse_reth;
    }

    state roce_only_imm {
        meta.roce_opcode_ok = 1;
        meta.roce_first = 1;
        meta.roce_imm = 1;
        meta.roce_last = 1;
        transition parse_reth_immdt;
    }

    state roce_middle {
        meta.roce_opcode_ok = 1;
        transition parse_roce_data;
    }

    state roce_last {
        meta.roce_opcode_ok = 1;
        meta.roce_last = 1;
        transition parse_roce_data;
    }

    state roce_last_imm {
        meta.roce_opcode_ok = 1;
        meta.roce_imm = 1;
        meta.roce_last = 1;
        transition parse_immdt;
    }

    // A select on meta.roce_imm is not Tofino's (a select reads packet bits): two states.
    state parse_reth {
        pkt.extract(hdr.reth);
        transition parse_roce_data;
    }

    state parse_reth_immdt {
        pkt.extract(hdr.reth);
        transition parse_immdt;
    }

    state parse_immdt {
        pkt.extract(hdr.immdt);
        transition parse_roce_data;
    }

    state parse_roce_data {
        pkt.extract(hdr.ina_data);
        pkt.extract(hdr.icrc);
        transition accept;
    }

    state parse_ina {
        meta.is_ina = 1;
        pkt.extract(hdr.ina);
        pkt.extract(hdr.ina_data);
        transition accept;
    }
}

control InaIngressDeparser(packet_out pkt,
                           inout tna_headers_t hdr,
                           in tna_ingress_metadata_t meta,
                           in ingress_intrinsic_metadata_for_deparser_t ig_dprsr_md) {
    Resubmit() resubmit;

    apply {
        if (ig_dprsr_md.resubmit_type == 1) {
            resubmit.emit(meta.resubmit_data);
        }
        pkt.emit(hdr);
    }
}

parser InaEgressParser(packet_in pkt,
                       out tna_headers_t hdr,
                       out tna_egress_metadata_t meta,
                       out egress_intrinsic_metadata_t eg_intr_md) {
    state start {
        pkt.extract(eg_intr_md);
        pkt.extract(hdr.bridge);
        transition select(hdr.bridge.result, hdr.bridge.upward) {
            (0, 0): accept;
            default: parse_ethernet;
        }
    }

    state parse_ethernet {
        pkt.extract(hdr.ethernet);
        pkt.extract(hdr.ipv4);
        pkt.extract(hdr.udp);
        pkt.extract(hdr.ina);
        transition accept;
    }
}

control InaEgressDeparser(packet_out pkt,
                          inout tna_headers_t hdr,
                          in tna_egress_metadata_t meta,
                          in egress_intrinsic_metadata_for_deparser_t eg_dprsr_md) {
    Checksum() ipv4_checksum;

    apply {
        if (hdr.ipv4.isValid()) {
            hdr.ipv4.hdr_checksum = ipv4_checksum.update({
                hdr.ipv4.version, hdr.ipv4.ihl, hdr.ipv4.diffserv, hdr.ipv4.total_len,
                hdr.ipv4.identification, hdr.ipv4.flags, hdr.ipv4.frag_offset,
                hdr.ipv4.ttl, hdr.ipv4.protocol, hdr.ipv4.src_addr, hdr.ipv4.dst_addr});
        }
        pkt.emit(hdr.ethernet);
        pkt.emit(hdr.ipv4);
        pkt.emit(hdr.udp);
        pkt.emit(hdr.bth);                      // a RoCEv2 reply's (roce_replies.p4), then
        pkt.emit(hdr.reth);                     // the lanes and the ICRC ingress left
        pkt.emit(hdr.immdt);
        pkt.emit(hdr.ina);
    }
}

#endif  // _INA_TNA_PARSERS_P4_
