/* configuration.p4: every constant of the INA program, each with its reason.
 *
 * The protocol constants mirror hostlib/protocol.py (THE wire format) and the drop
 * reasons and statistics mirror emulation/softswitch/pipeline.py (the reference
 * semantics); tests/unit/test_p4_sources.py holds them equal. Every constant is typed
 * bit<32> unless a header field fixes its width, so arithmetic stays on bit<32>.
 */
#ifndef _INA_CONFIGURATION_P4_
#define _INA_CONFIGURATION_P4_

/* ---------------------------------------------------------------- protocol */

// Ethernet and IP numbers the parser selects on (IEEE, IANA).
const bit<16> ETHERTYPE_IPV4 = 0x0800;
const bit<8> IP_PROTOCOL_UDP = 17;

// Bumped on any incompatible header change; other versions are dropped as malformed.
const bit<4> PROTOCOL_VERSION = 1;

// Packet types (hostlib.protocol.PacketType): DATA worker -> switch, RESULT switch -> worker.
const bit<4> PTYPE_DATA = 1;
const bit<4> PTYPE_RESULT = 2;

// UDP destination port that marks INA traffic: 0x4E41 = 20033, "NA", not registered.
const bit<16> INA_UDP_PORT = 0x4E41;

// flags bit the host sets on a retransmission (hostlib/protocol.py FLAG_RESEND). Only
// sharing reads it (sharing.p4): a retransmission of a shared slot that would start a
// use there, or that the slot counted already, goes to the job's fallback aggregator.
const bit<8> FLAG_RESEND = 0x01;

// INA over RoCEv2 (hostlib/protocol.py ROCE_*, RoceOpcode; docs/protocol.md).
const bit<16> ROCE_UDP_PORT = 4791;
const bit<8> ROCE_WRITE_FIRST = 0x26;
const bit<8> ROCE_WRITE_MIDDLE = 0x27;
const bit<8> ROCE_WRITE_LAST = 0x28;
const bit<8> ROCE_WRITE_LAST_IMM = 0x29;
const bit<8> ROCE_WRITE_ONLY = 0x2A;
const bit<8> ROCE_WRITE_ONLY_IMM = 0x2B;
const bit<32> ROCE_BTH_BYTES = 12;
const bit<32> ROCE_RETH_BYTES = 16;
const bit<32> ROCE_IMMDT_BYTES = 4;
const bit<32> ROCE_ICRC_BYTES = 4;
// Cells of each per-queue-pair register (emulation/softswitch/roce.py ROCE_QP_REGISTERS).
const bit<32> ROCE_QP_REGISTERS = 16384;
// A reply's PSN: its queue pair's base + (seq << ROCE_PSN_SEQ_SHIFT) + its place in the
// message (hostlib/protocol.py ROCE_PSN_SEQ_SHIFT; messages of at most 32 packets).
const bit<8> ROCE_PSN_SEQ_SHIFT = 5;
const bit<3> IPV4_FLAG_DF = 2;

// Bytes of the INA header: the fields of headers.p4, lanes 4-byte aligned.
const bit<32> HEADER_SIZE = 16;

// int32 lanes per packet. Each lane is its own register array indexed by slot and is
// named once, unrolled (P4 has no loops): gen_lanes.py writes data_header.p4 and
// values.p4. 64 lanes = 256 B of payload, SwitchML's unit, and 64 register arrays.
const bit<32> LANES_PER_PACKET = 64;

// Bytes per lane: one int32.
const bit<32> LANE_BYTES = 4;

// UDP payload of a valid DATA packet: header + lanes (hostlib.protocol.packet_size).
const bit<32> INA_PAYLOAD_BYTES = HEADER_SIZE + LANES_PER_PACKET * LANE_BYTES;

// A RoCEv2 packet's lanes: the path MTU of a message's packets (256 B for 64 lanes).
const bit<32> ROCE_PAYLOAD_BYTES = LANES_PER_PACKET * LANE_BYTES;

// UDP header bytes; the parser only takes IPv4 without options (ihl = 5), 20 bytes.
const bit<32> UDP_HEADER_BYTES = 8;
const bit<32> IPV4_HEADER_BYTES = 20;

// Bit 31 of (seq - stored) mod 2^32 set: seq is older than the stored seq (serial-number
// order, RFC 1982), which holds while no packet is delayed past 2^31 later packets.
const bit<32> SEQ_OLDER_BIT = 0x80000000;

// Workers per job: the worker bitmap is one 32-bit register cell per slot and set.
const bit<32> MAX_WORKERS = 32;

/* ---------------------------------------------------------------- switch memory */

// Slots per set in the switch pool (every job takes a contiguous range). Twice
// SwitchML's 8192 per set: bmv2 registers have no per-stage size limit, and 16384 x 2
// sets x 64 lanes x 4 B = 8 MiB of value registers is cheap for bmv2.
const bit<32> SWITCH_SLOTS = 16384;

// Cells of a per-(set, slot) register: both sets, index = set * SWITCH_SLOTS + slot.
const bit<32> REGISTER_SIZE = 2 * SWITCH_SLOTS;

// Cells of a per-slot bitmap register: one register array per set, indexed by slot.
const bit<32> BITMAP_SIZE = SWITCH_SLOTS;

// Job table entries: bmv2 tables are hash maps with no hardware limit; 1024 jobs is
// far more than a testbed runs at once (each takes at least one slot of the pool).
const bit<32> JOB_TABLE_SIZE = 1024;

// Worker table entries: one per (job, rank), MAX_WORKERS per job.
const bit<32> WORKER_TABLE_SIZE = MAX_WORKERS * JOB_TABLE_SIZE;

// Replica table entries: one per (job, rank), like the worker table.
const bit<32> REPLICA_TABLE_SIZE = MAX_WORKERS * JOB_TABLE_SIZE;

// Upstream table entries (upstream.p4): at most one per job, like the job table.
const bit<32> UPSTREAM_TABLE_SIZE = JOB_TABLE_SIZE;

// Sharing tables (sharing.p4): at most one entry per job in each, like the job table.
const bit<32> SHARED_TABLE_SIZE = JOB_TABLE_SIZE;
const bit<32> FALLBACK_TABLE_SIZE = JOB_TABLE_SIZE;
const bit<32> BEHIND_TABLE_SIZE = JOB_TABLE_SIZE;

// Cells of each of sharing's per-job counters (sharing.p4): one a job of the jobs table.
// A job's cell is the controller's, named by its shared and fallback entries, so the
// arrays are sized by the jobs a switch holds, not by the 65536 job ids
// (emulation/softswitch/sharing.py STATS_CELLS).
const bit<32> SHARING_STATS_SIZE = JOB_TABLE_SIZE;

// L2 forwarding entries for ordinary traffic: SwitchML's forwarding table size.
const bit<32> FORWARD_TABLE_SIZE = 1024;

/* ---------------------------------------------------------------- drop simulator */

// The drop simulator draws r uniformly from 0..SIM_RANDOM_MAX and drops when
// r < probability register, so the register holds round(p * 2^31): 0 never drops,
// 2^31 always does. bmv2's random() takes any range (v1model.p4); 2^31 steps resolve
// probabilities far below SwitchML's 0..32767 scale. bmv2 cannot seed it.
const bit<32> SIM_RANDOM_MAX = 0x7FFFFFFF;

// Each simulator has one probability for all ports, as the soft switch's
// (--drop-ingress, --drop-egress): a one-cell register, read at index 0.
const bit<32> SIM_PROBABILITY_CELLS = 1;
const bit<32> SIM_PROBABILITY_INDEX = 0;

/* ---------------------------------------------------------------- statistics */

// Indices of the ina_stats counters, in the order of the soft switch's statistics
// (pipeline.Pipeline.stats). Ingress counts all but results_sent and sent_upstream,
// which egress counts per packet that leaves (Egress.ina_stats); the controller adds
// the two arrays. The last three are a leaf's of hierarchical aggregation (upstream.p4),
// appended so the earlier indices keep their meaning.
const bit<32> STAT_RECEIVED = 0;
const bit<32> STAT_AGGREGATED = 1;
const bit<32> STAT_COMPLETED = 2;
const bit<32> STAT_RESULTS_SENT = 3;
const bit<32> STAT_RETRANSMITS_ANSWERED = 4;
const bit<32> STAT_DUPLICATES_IGNORED = 5;
const bit<32> STAT_SENT_UPSTREAM = 6;          // partial sums sent to the upstream switch
const bit<32> STAT_UPSTREAM_RESENT = 7;        // ... again, for a local retransmission
const bit<32> STAT_RESULTS_FROM_UPSTREAM = 8;  // RESULTs taken from the upstream switch
const bit<32> NUM_STATS = 9;

// Indices of the drops counters, in pipeline.DropReason order (one counter each).
const bit<32> DROP_TRUNCATED = 0;
const bit<32> DROP_MALFORMED = 1;
const bit<32> DROP_UNKNOWN_JOB = 2;
const bit<32> DROP_BAD_RANK = 3;
const bit<32> DROP_BAD_SOURCE = 4;
const bit<32> DROP_BAD_SLOT = 5;
const bit<32> DROP_BAD_LANES = 6;
const bit<32> DROP_BAD_LENGTH = 7;
const bit<32> DROP_STALE = 8;
const bit<32> DROP_SIM_INGRESS = 9;
const bit<32> DROP_SIM_EGRESS = 10;
const bit<32> DROP_UNKNOWN_QP = 11;   // RoCEv2: dest QP not in roce_requests
const bit<32> DROP_BAD_PSN = 12;      // RoCEv2: PSN out of sequence (UC)
const bit<32> DROP_BAD_ICRC = 13;     // RoCEv2: software data planes only (P4 cannot check)
const bit<32> NUM_DROP_REASONS = 14;

// meta.drop_reason of a packet nothing has dropped (not a counter index).
const bit<32> NO_DROP = 0xFFFFFFFF;

/* ---------------------------------------------------------------- lane operations */

// What exponents.p4 and values.p4 do with the slot's registers for this packet.
const bit<2> LANE_OP_NONE = 0;   // nothing: dropped, consumed or duplicate
const bit<2> LANE_OP_WRITE = 1;  // first contribution: write, no clearing between uses;
                                 // or the upstream switch's RESULT: write its values
const bit<2> LANE_OP_ADD = 2;    // later contribution: add lanes, max the exponent
const bit<2> LANE_OP_READ = 3;   // retransmission of a finished use: read the result
                                 // (or the partial sum, to send it up again)

#endif  // _INA_CONFIGURATION_P4_
