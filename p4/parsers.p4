/* parsers.p4: IngressParser and InaDeparser, the two ends of the wire format.
 *
 * INA traffic is UDP to INA_UDP_PORT over IPv4 without options or fragmentation;
 * anything else is ordinary traffic (Gloo, ARP, ...) for forwarder.p4.
 *
 * A short INA packet ends the parse with error.PacketTooShort. v1model does not drop
 * it: ingress runs with standard_metadata.parser_error set and the headers extracted
 * so far still valid, so ingress tells the soft switch's two cases apart:
 *   - hdr.ina invalid: shorter than the 16-byte header   -> DROP_TRUNCATED (so is a UDP
 *     length below 8 + 16: Ethernet padding completed the header, ina.p4);
 *   - hdr.ina valid, hdr.ina_data invalid: short payload -> DROP_BAD_LENGTH, after the
 *     checks that come first in pipeline.Pipeline.process.
 */
#ifndef _INA_PARSERS_P4_
#define _INA_PARSERS_P4_

parser IngressParser(packet_in packet,
                     out headers_t hdr,
                     inout metadata_t meta,
                     inout standard_metadata_t standard_metadata) {
    state start {
        packet.extract(hdr.ethernet);
        transition select(hdr.ethernet.ether_type) {
            ETHERTYPE_IPV4: parse_ipv4;
            default: accept;
        }
    }

    state parse_ipv4 {
        packet.extract(hdr.ipv4);
        // Options or a fragment would move or split the UDP header: not INA.
        transition select(hdr.ipv4.ihl, hdr.ipv4.frag_offset, hdr.ipv4.protocol) {
            (4w5, 13w0, IP_PROTOCOL_UDP): parse_udp;
            default: accept;
        }
    }

    state parse_udp {
        packet.extract(hdr.udp);
        transition select(hdr.udp.dst_port) {
            INA_UDP_PORT: parse_ina;
            ROCE_UDP_PORT: parse_bth;
            default: accept;
        }
    }

    // INA over RoCEv2 (roce.p4): the opcode says which headers follow.
    state parse_bth {
        meta.is_ina = 1;
        meta.is_roce = 1;
        packet.extract(hdr.bth);
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
        transition parse_reth;
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

    state parse_reth {
        packet.extract(hdr.reth);
        transition select(meta.roce_imm) {
            1: parse_immdt;
            default: parse_roce_data;
        }
    }

    state parse_immdt {
        packet.extract(hdr.immdt);
        transition parse_roce_data;
    }

    state parse_roce_data {
        packet.extract(hdr.ina_data);
        packet.extract(hdr.icrc);
        transition accept;
    }

    state parse_ina {
        meta.is_ina = 1;
        packet.extract(hdr.ina);
        transition parse_ina_data;
    }

    state parse_ina_data {
        packet.extract(hdr.ina_data);
        transition accept;
    }
}

control InaDeparser(packet_out packet, in headers_t hdr) {
    apply {
        // emit() skips invalid headers.
        packet.emit(hdr.ethernet);
        packet.emit(hdr.ipv4);
        packet.emit(hdr.udp);
        packet.emit(hdr.ina);
        packet.emit(hdr.bth);
        packet.emit(hdr.reth);
        packet.emit(hdr.immdt);
        packet.emit(hdr.ina_data);
        packet.emit(hdr.icrc);
    }
}

#endif  // _INA_PARSERS_P4_
