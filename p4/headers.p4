/* headers.p4: the headers the switch parses, and the struct that holds them.
 *
 * Ethernet / IPv4 / UDP / INA header (16 bytes) / 64 int32 lanes, or, for INA over
 * RoCEv2, Ethernet / IPv4 / UDP (4791) / BTH / [RETH] / [ImmDt] / 64 lanes / ICRC. The INA header
 * declares the fields of hostlib/protocol.py (struct "!BBHBbHHHI") bit for bit;
 * docs/protocol.md draws the layout.
 */
#ifndef _INA_HEADERS_P4_
#define _INA_HEADERS_P4_

#include "types.p4"
#include "data_header.p4"

header ethernet_h {
    mac_addr_t dst_addr;
    mac_addr_t src_addr;
    bit<16> ether_type;
}

header ipv4_h {
    bit<4> version;
    bit<4> ihl;
    bit<8> diffserv;
    bit<16> total_len;
    bit<16> identification;
    bit<3> flags;
    bit<13> frag_offset;
    bit<8> ttl;
    bit<8> protocol;
    bit<16> hdr_checksum;
    ipv4_addr_t src_addr;
    ipv4_addr_t dst_addr;
}

header udp_h {
    l4_port_t src_port;
    l4_port_t dst_port;
    bit<16> length;
    bit<16> checksum;
}

// 16 bytes; field order and widths are the wire format (hostlib.protocol.HEADER).
header ina_h {
    bit<4> version;      // PROTOCOL_VERSION
    bit<4> ptype;        // PTYPE_DATA or PTYPE_RESULT
    bit<8> flags;        // FLAG_RESEND: read only for shared slots (sharing.p4)
    bit<16> job_id;      // key of the jobs table
    bit<8> rank;         // the worker's bit in the slot bitmap
    bit<8> exponent;     // signed (int8): compared as (int<8>) in exponents.p4
    bit<16> num_lanes;   // must be LANES_PER_PACKET
    bit<1> pool_set;     // POOL_SET_BIT: which of the slot's two sets
    bit<15> slot;        // SLOT_MASK: slot relative to the job's slot base
    bit<16> reserved;    // zero on send, ignored
    bit<32> seq;         // the use of the slot this packet belongs to
}

// RoCEv2 (roce.p4; hostlib/rocev2.py builds the same bytes): the Base Transport Header,
// the RDMA Extended Transport Header of a message's first packet, the immediate of its
// last, and the ICRC trailer after the lanes.
header bth_h {
    bit<8> opcode;         // ROCE_WRITE_*: UC RDMA WRITE
    bit<1> solicited;
    bit<1> mig_req;
    bit<2> pad_count;      // 0: lanes are whole words
    bit<4> transport_version;
    bit<16> pkey;
    bit<8> fecn_becn_resv; // FECN, BECN and 6 reserved bits (ones in the ICRC)
    bit<24> dest_qp;       // the switch's queue pair (request) or the worker's (reply)
    bit<1> ack_req;
    bit<7> resv7;
    bit<24> psn;
}

header reth_h {
    bit<64> va;            // request: seq (63..32), exponent (31..24); reply: the address
    bit<32> rkey;          // request: the pool_index (15..0); reply: the worker's R_Key
    bit<32> dma_length;    // the message's bytes
}

header immdt_h {
    bit<32> imm;           // seq's low 24 bits, then the exponent
}

header icrc_h {
    bit<32> crc;
}

struct headers_t {
    ethernet_h ethernet;
    ipv4_h ipv4;
    udp_h udp;
    ina_h ina;
    bth_h bth;
    reth_h reth;
    immdt_h immdt;
    ina_data_h ina_data;
    icrc_h icrc;
}

#endif  // _INA_HEADERS_P4_
