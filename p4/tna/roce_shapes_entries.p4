/* roce_shapes_entries.p4: roce.p4's table roce_shapes, highest priority first.
 *
 * Key (first, msg_shift, dma_length, rkey). Any packet of a message of 2^msg_shift
 * packets (msg_shift 0..5) gets the message's mask. A FIRST (or ONLY) also needs, in
 * ../roce.p4's order, R_Key bits 31..16 zero (else DROP_MALFORMED), the message's DMA
 * length (else DROP_BAD_LENGTH) and a first slot that is a multiple of its packets (else
 * DROP_BAD_SLOT): entries that match only when the earlier checks hold. The DMA lengths
 * are configuration.p4's constants, which follow TNA_LANES_PER_PACKET.
 */
            (0, 0, _, _) : roce_shape(0x0000);
            (0, 1, _, _) : roce_shape(0x0001);
            (0, 2, _, _) : roce_shape(0x0003);
            (0, 3, _, _) : roce_shape(0x0007);
            (0, 4, _, _) : roce_shape(0x000F);
            (0, 5, _, _) : roce_shape(0x001F);
            (1, 0, TNA_ROCE_MSG_BYTES_1, 0x00000000 &&& 0xFFFF0000) : roce_shape(0x0000);
            (1, 1, TNA_ROCE_MSG_BYTES_2, 0x00000000 &&& 0xFFFF0001) : roce_shape(0x0001);
            (1, 2, TNA_ROCE_MSG_BYTES_4, 0x00000000 &&& 0xFFFF0003) : roce_shape(0x0003);
            (1, 3, TNA_ROCE_MSG_BYTES_8, 0x00000000 &&& 0xFFFF0007) : roce_shape(0x0007);
            (1, 4, TNA_ROCE_MSG_BYTES_16, 0x00000000 &&& 0xFFFF000F) : roce_shape(0x000F);
            (1, 5, TNA_ROCE_MSG_BYTES_32, 0x00000000 &&& 0xFFFF001F) : roce_shape(0x001F);
            (1, 1, TNA_ROCE_MSG_BYTES_2, 0x00000000 &&& 0xFFFF0000) : roce_first_bad((bit<8>)DROP_BAD_SLOT);
            (1, 2, TNA_ROCE_MSG_BYTES_4, 0x00000000 &&& 0xFFFF0000) : roce_first_bad((bit<8>)DROP_BAD_SLOT);
            (1, 3, TNA_ROCE_MSG_BYTES_8, 0x00000000 &&& 0xFFFF0000) : roce_first_bad((bit<8>)DROP_BAD_SLOT);
            (1, 4, TNA_ROCE_MSG_BYTES_16, 0x00000000 &&& 0xFFFF0000) : roce_first_bad((bit<8>)DROP_BAD_SLOT);
            (1, 5, TNA_ROCE_MSG_BYTES_32, 0x00000000 &&& 0xFFFF0000) : roce_first_bad((bit<8>)DROP_BAD_SLOT);
            (1, _, _, 0x00000000 &&& 0xFFFF0000) : roce_first_bad((bit<8>)DROP_BAD_LENGTH);
            (1, _, _, _) : roce_first_bad((bit<8>)DROP_MALFORMED);
