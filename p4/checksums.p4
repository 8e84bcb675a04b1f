/* checksums.p4: InaVerifyChecksum and InaComputeChecksum, the v1model checksum stages.
 *
 * Ingress does not verify: a host's kernel drops a bad checksum anyway, and the soft
 * switch never sees one. Egress recomputes the IPv4 header checksum of every IPv4
 * packet, since results change addresses (forwarded packets keep their checksum). A
 * result's UDP checksum is 0 (next_step.p4): "none" for UDP over IPv4, so the switch
 * need not sum the 272-byte payload.
 */
#ifndef _INA_CHECKSUMS_P4_
#define _INA_CHECKSUMS_P4_

control InaVerifyChecksum(inout headers_t hdr, inout metadata_t meta) {
    apply { }
}

control InaComputeChecksum(inout headers_t hdr, inout metadata_t meta) {
    apply {
        update_checksum(
            hdr.ipv4.isValid(),
            { hdr.ipv4.version,
              hdr.ipv4.ihl,
              hdr.ipv4.diffserv,
              hdr.ipv4.total_len,
              hdr.ipv4.identification,
              hdr.ipv4.flags,
              hdr.ipv4.frag_offset,
              hdr.ipv4.ttl,
              hdr.ipv4.protocol,
              hdr.ipv4.src_addr,
              hdr.ipv4.dst_addr },
            hdr.ipv4.hdr_checksum,
            HashAlgorithm.csum16);
    }
}

#endif  // _INA_CHECKSUMS_P4_
