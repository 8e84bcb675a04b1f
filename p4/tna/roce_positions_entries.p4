/* roce_positions_entries.p4: roce_replies.p4's table roce_positions, by msg_shift (0..5:
 * messages of 1..32 packets, roce_shapes_entries.p4's).
 */
            (0) : roce_shift_0();
            (1) : roce_shift_1();
            (2) : roce_shift_2();
            (3) : roce_shift_3();
            (4) : roce_shift_4();
            (5) : roce_shift_5();
