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
// stages after the slot's bookkeeping (p4/README.md, "Tofino: stages"): 7 stages of 4
// lanes, the slot's exponent beside them. Written by gen_tna.py into values.p4 and
// data_header.p4; hostlib.protocol.TNA_LANES_PER_PACKET holds the same number.
const bit<32> TNA_LANES_PER_PACKET = 28;

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
