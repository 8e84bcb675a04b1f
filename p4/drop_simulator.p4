/* drop_simulator.p4: IngressDropSimulator and EgressDropSimulator, SwitchML's drop
 * simulator for loss tests: Bernoulli loss as INA packets arrive and per result as it
 * leaves (per replica for a multicast result), like the soft switch's DropSimulator.
 *
 * Two controls rather than one control instantiated twice: ingress and egress cannot
 * share a register, and every object here has an absolute @name, which a second
 * instance would duplicate. Each has a one-cell register holding the probability
 * scaled to 2^31 (configuration.p4, SIM_RANDOM_MAX): the controller writes
 * round(p * 2^31); 0, the reset value, disables the simulator. bmv2's random() is not
 * seeded, so unlike the soft switch's a run's losses are not reproducible.
 */
#ifndef _INA_DROP_SIMULATOR_P4_
#define _INA_DROP_SIMULATOR_P4_

control IngressDropSimulator(inout metadata_t meta) {
    @id(0x16080001) @name(".Ingress.drop_simulator.probability")
    register<bit<32>>(SIM_PROBABILITY_CELLS) probability;

    apply {
        bit<32> threshold;
        bit<32> draw;
        probability.read(threshold, SIM_PROBABILITY_INDEX);
        if (threshold != 0) {
            random(draw, (bit<32>)0, SIM_RANDOM_MAX);
            if (draw < threshold) {
                meta.drop_reason = DROP_SIM_INGRESS;
            }
        }
    }
}

control EgressDropSimulator(inout metadata_t meta) {
    @id(0x16080002) @name(".Egress.drop_simulator.probability")
    register<bit<32>>(SIM_PROBABILITY_CELLS) probability;

    apply {
        bit<32> threshold;
        bit<32> draw;
        probability.read(threshold, SIM_PROBABILITY_INDEX);
        if (threshold != 0) {
            random(draw, (bit<32>)0, SIM_RANDOM_MAX);
            if (draw < threshold) {
                meta.drop_reason = DROP_SIM_EGRESS;
            }
        }
    }
}

#endif  // _INA_DROP_SIMULATOR_P4_
