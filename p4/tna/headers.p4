/* tna/headers.p4: the headers of the TNA program.
 *
 * Ethernet, IPv4 and UDP are the v1model program's (../headers.p4). The INA header is
 * its ina_h bit for bit (hostlib/protocol.py's wire format) but for pool_index: one
 * 16-bit field (bit 15 the set, bits 0-14 the slot), since Tofino's PHV allocation
 * refuses arithmetic on ina_h's 15-bit slot ("slice list is not byte-sized"). The lanes
 * are fewer (data_header.p4, generated: TNA_LANES_PER_PACKET). The RoCEv2 headers (BTH,
 * RETH, ImmDt, ICRC) are ../headers.p4's; the struct's order is the deparsers' emit order,
 * so a reply's BTH, RETH and ImmDt go where ingress's INA header was (roce_replies.p4).
 */
#ifndef _INA_TNA_HEADERS_P4_
#define _INA_TNA_HEADERS_P4_

#include "../headers.p4"
#include "types.p4"
#include "data_header.p4"

header tna_ina_h {
    bit<4> version;
    bit<4> ptype;
    bit<8> flags;
    bit<16> job_id;
    bit<8> rank;
    bit<8> exponent;
    bit<16> num_lanes;
    bit<16> pool_index;  // POOL_SET_BIT (15) and the slot (0-14), as on the wire
    bit<16> reserved;
    bit<32> seq;
}

struct tna_headers_t {
    bridge_h bridge;
    ethernet_h ethernet;
    ipv4_h ipv4;
    udp_h udp;
    bth_h bth;            // RoCEv2 (roce.p4, roce_replies.p4): ../headers.p4's headers
    reth_h reth;
    immdt_h immdt;
    tna_ina_h ina;
    tna_data_h ina_data;
    icrc_h icrc;          // a RoCEv2 frame's trailer, after the lanes
}

#endif  // _INA_TNA_HEADERS_P4_
