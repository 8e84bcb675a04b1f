/* tna/configuration.p4: the constants of the Tofino (TNA) program, each with its reason.
 *
 * The protocol constants (UDP port, version, packet types, header size, stats and drop
 * indices, lane operations) are the v1model program's: ../configuration.p4, included
 * here, is the one list both programs and tests/unit/test_p4_sources.py read. What
 * differs on Tofino is below: the lanes a pass can carry, the pool a stage's SRAM holds,
 * and the encodings the stateful ALUs and match tables need.
 */
#ifndef _INA_TNA_CONFIGURATION_P4_
#define _INA_TNA_CONFIGURATION_P4_

#include "../configuration.p4"

/* ---------------------------------------------------------------- lanes and pool */

// int32 lanes per packet. One 32-bit register a lane, 4 stateful ALUs a stage, and the
// stages left after the rest (ina_tna.resources.txt): RoCEv2 takes stages 0-4 (roce.p4:
// its lookups, the queue pair's five registers in stages 3 and 4), the slot's bookkeeping
// stages 4-8 (jobs, seq, missing workers, next step and final, the exponent), so stages
// 9-11 hold the lanes: 12 (28 before RoCEv2, 7 stages of 4). Stage 8's free stateful ALUs
// are no use: its 16 logical tables are taken. Written by gen_tna.py into values.p4 and data_header.p4;
// hostlib.protocol.TNA_LANES_PER_PACKET holds the same number.
const bit<32> TNA_LANES_PER_PACKET = 12;

// UDP payload of a valid DATA packet: the 16-byte header and the lanes.
const bit<32> TNA_PAYLOAD_BYTES = HEADER_SIZE + TNA_LANES_PER_PACKET * LANE_BYTES;

// Slots per set: SwitchML's 8192 (a register of 16384 32-bit cells is 4 of a stage's 80
// SRAM blocks; 4 such registers a stage leave room for the stage's match tables).
const bit<32> TNA_SWITCH_SLOTS = 8192;

// Cells of every per-(set, slot) register: index = set * TNA_SWITCH_SLOTS + slot, taken
// by an identity hash of {pool_set, abs_slot[12:0]} (a 14-bit register index).
const bit<32> TNA_REGISTER_SIZE = 16384;
typedef bit<14> tna_index_t;

// pool_index's slot bits (hostlib.protocol.SLOT_MASK); bit 15 is the set.
const bit<16> SLOT_MASK = 0x7FFF;

/* ---------------------------------------------------------------- RoCEv2 */

// INA over RoCEv2 (roce.p4, roce_replies.p4; docs/protocol.md): a packet's payload is the
// lanes alone, and a message of 2^msg_shift packets carries that many payloads.
const bit<32> TNA_ROCE_PAYLOAD_BYTES = TNA_LANES_PER_PACKET * LANE_BYTES;
// Messages of 1..32 packets (msg_shift 0..5, the const tables' entries): a message
// covers consecutive slots of the 32-slot windows SwitchML-RDMA uses; bigger ones miss
// the tables (DROP_BAD_LENGTH) and get no replies.
const bit<32> TNA_ROCE_MSG_BYTES_1 = TNA_ROCE_PAYLOAD_BYTES;
const bit<32> TNA_ROCE_MSG_BYTES_2 = 2 * TNA_ROCE_PAYLOAD_BYTES;
const bit<32> TNA_ROCE_MSG_BYTES_4 = 4 * TNA_ROCE_PAYLOAD_BYTES;
const bit<32> TNA_ROCE_MSG_BYTES_8 = 8 * TNA_ROCE_PAYLOAD_BYTES;
const bit<32> TNA_ROCE_MSG_BYTES_16 = 16 * TNA_ROCE_PAYLOAD_BYTES;
const bit<32> TNA_ROCE_MSG_BYTES_32 = 32 * TNA_ROCE_PAYLOAD_BYTES;
// UDP length of each request opcode (UDP, BTH, [RETH], [ImmDt], the lanes, ICRC): a
// gateway compares a field with a constant only.
const bit<32> TNA_ROCE_UDP_BYTES = UDP_HEADER_BYTES + ROCE_BTH_BYTES + TNA_ROCE_PAYLOAD_BYTES + ROCE_ICRC_BYTES;
const bit<32> TNA_ROCE_UDP_FIRST = TNA_ROCE_UDP_BYTES + ROCE_RETH_BYTES;
const bit<32> TNA_ROCE_UDP_LAST_IMM = TNA_ROCE_UDP_BYTES + ROCE_IMMDT_BYTES;
const bit<32> TNA_ROCE_UDP_ONLY_IMM = TNA_ROCE_UDP_BYTES + ROCE_RETH_BYTES + ROCE_IMMDT_BYTES;
// expect_psn (roce.p4) holds the next PSN in bits 31..8, so that adding ROCE_QP_PSN_ONE
// wraps as 24-bit PSNs do, and ROCE_QP_OPEN while a message is open: one comparison in
// the stateful ALU checks both.
const bit<32> ROCE_QP_OPEN = 1;
const bit<32> ROCE_QP_PSN_ONE = 0x100;

/* ---------------------------------------------------------------- passes */

// A use's first packet goes through the pipeline twice (resubmit): the first pass sees
// that the slot is free, the second advances the slot's seq and starts the use. The
// resubmit header's pass value; Tofino 1 resubmits a packet once, which is all it needs.
const bit<8> TNA_PASS_SECOND = 2;

/* ---------------------------------------------------------------- decisions */

// meta.mode: what checks.p4 did with the slot's missing-workers register.
const bit<3> MODE_NONE = 0;    // dropped by a check, or not an INA packet
const bit<3> MODE_JOIN = 1;    // the packet's seq is the slot's: clear the sender's bit
const bit<3> MODE_PEEK = 2;    // a newer seq (pass 1): is the slot free?
const bit<3> MODE_START = 3;   // pass 2, the seq advanced: the use's first contribution
const bit<3> MODE_RESULT = 4;  // the upstream switch's RESULT: is the slot finished?
const bit<3> MODE_RESTART = 5; // a loose slot's newer use took it over (sharing.p4)

// meta.drop_reason of a packet no check has dropped; DROP_* (../configuration.p4) are the
// drop counter's indices and fit 8 bits.
const bit<8> TNA_NO_DROP = 0xFF;

// Drop simulator: Random<bit<31>> draws 0..2^31-1 and the packet drops when the draw is
// below the probability register, which holds round(p * 2^31) as on bmv2.
typedef bit<31> tna_draw_t;

/* ---------------------------------------------------------------- sizes */

// Tables sized for Tofino's SRAM (exact match): as the v1model program's.
const bit<32> TNA_JOB_TABLE_SIZE = 1024;
const bit<32> TNA_WORKER_TABLE_SIZE = MAX_WORKERS * TNA_JOB_TABLE_SIZE;
const bit<32> TNA_REPLICA_TABLE_SIZE = MAX_WORKERS * TNA_JOB_TABLE_SIZE;
const bit<32> TNA_UPSTREAM_TABLE_SIZE = TNA_JOB_TABLE_SIZE;
const bit<32> TNA_FORWARD_TABLE_SIZE = 1024;

#endif  // _INA_TNA_CONFIGURATION_P4_
