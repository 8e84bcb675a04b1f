/* roce_places_entries.p4: roce_replies.p4's table roce_places, highest priority first.
 *
 * Key (msg_shift, pool_index): a slot's place in its message of 2^msg_shift packets is
 * its low msg_shift bits (a message's first slot is a multiple of its packets): 0 the
 * first, all ones the last, a one-packet message both.
 */
            (0, _) : roce_only();
            (1, 0x0000 &&& 0x0001) : roce_first();
            (1, 0x0001 &&& 0x0001) : roce_last();
            (1, _) : roce_middle();
            (2, 0x0000 &&& 0x0003) : roce_first();
            (2, 0x0003 &&& 0x0003) : roce_last();
            (2, _) : roce_middle();
            (3, 0x0000 &&& 0x0007) : roce_first();
            (3, 0x0007 &&& 0x0007) : roce_last();
            (3, _) : roce_middle();
            (4, 0x0000 &&& 0x000F) : roce_first();
            (4, 0x000F &&& 0x000F) : roce_last();
            (4, _) : roce_middle();
            (5, 0x0000 &&& 0x001F) : roce_first();
            (5, 0x001F &&& 0x001F) : roce_last();
            (5, _) : roce_middle();
