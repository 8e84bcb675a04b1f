/* tna/drop_simulator.p4: Bernoulli loss on INA packets, as ../drop_simulator.p4: a
 * one-cell probability register holding round(p * 2^31) and a 31-bit random draw; the
 * packet drops when the draw is below it. The comparison runs in the register's
 * stateful ALU (a gateway cannot compare two fields). Ingress and egress each have one.
 * Tofino's Random cannot be seeded from P4 either.
 */
#ifndef _INA_TNA_DROP_SIMULATOR_P4_
#define _INA_TNA_DROP_SIMULATOR_P4_

control TnaIngressDropSimulator(inout tna_ingress_metadata_t meta) {
    @name(".Ingress.drop_simulator.probability")
    Register<bit<32>, bit<1>>(1, 0) probability;
    RegisterAction<bit<32>, bit<1>, bit<8>>(probability) below = {
        void apply(inout bit<32> value, out bit<8> drop) {
            if (value > (bit<32>)meta.draw) {
                drop = 1;
            } else {
                drop = 0;
            }
        }
    };
    Random<tna_draw_t>() random;

    apply {
        meta.draw = random.get();
        meta.sim_drop = below.execute(0);
    }
}

control TnaEgressDropSimulator(inout tna_egress_metadata_t meta) {
    @name(".Egress.drop_simulator.probability")
    Register<bit<32>, bit<1>>(1, 0) probability;
    RegisterAction<bit<32>, bit<1>, bit<8>>(probability) below = {
        void apply(inout bit<32> value, out bit<8> drop) {
            if (value > (bit<32>)meta.draw) {
                drop = 1;
            } else {
                drop = 0;
            }
        }
    };
    Random<tna_draw_t>() random;

    apply {
        meta.draw = random.get();
        meta.sim_drop = below.execute(0);
    }
}

#endif  // _INA_TNA_DROP_SIMULATOR_P4_
