/* exponents.p4: Exponents, the slot's block exponent (SwitchML's exponents control).
 *
 * One signed 8-bit exponent per (set, slot). meta.lane_op: WRITE stores the packet's
 * exponent (a first contribution's, or on a leaf the upstream switch's result's); ADD
 * keeps the max, compared as int<8> (the field and register are bit<8> on the wire and
 * in P4Runtime); READ loads the stored exponent for a unicast answer (or a partial sum
 * sent up again).
 * Afterwards hdr.ina.exponent is the slot's exponent, which a result carries.
 */
#ifndef _INA_EXPONENTS_P4_
#define _INA_EXPONENTS_P4_

control Exponents(inout headers_t hdr, in metadata_t meta) {
    @id(0x16060001) @name(".Ingress.exponents.exponent")
    register<bit<8>>(REGISTER_SIZE) exponent;

    apply {
        bit<8> stored;
        if (meta.lane_op == LANE_OP_WRITE) {
            exponent.write(meta.index, hdr.ina.exponent);
        } else if (meta.lane_op == LANE_OP_ADD) {
            exponent.read(stored, meta.index);
            if ((int<8>)stored > (int<8>)hdr.ina.exponent) {
                hdr.ina.exponent = stored;
            }
            exponent.write(meta.index, hdr.ina.exponent);
        } else if (meta.lane_op == LANE_OP_READ) {
            exponent.read(hdr.ina.exponent, meta.index);
        }
    }
}

#endif  // _INA_EXPONENTS_P4_
