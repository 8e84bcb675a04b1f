/* bitmap.p4: Bitmap, step 2 of the slot algorithm (SwitchML's bitmap_checker).
 *
 * One 32-bit worker bitmap per slot and set (bit r = rank r), one register array per
 * set indexed by the absolute slot. A packet of set k ORs its bit into set k and
 * clears it in set 1-k; the bit read before the update, if set, means this worker's
 * contribution to the running use was already received: meta.seen = 1 (duplicate,
 * ignored; the result reaches the sender by multicast). Runs only for packets the seq
 * check let through to the bitmaps (not stale, not answered).
 * In a loose slot (meta.loose, sharing.p4) a packet touches only its own set: the other
 * set's use may run at another place. A new use there (meta.restart, seq_check.p4)
 * starts from a clear bitmap: the bits of the uses before go.
 */
#ifndef _INA_BITMAP_P4_
#define _INA_BITMAP_P4_

control Bitmap(in headers_t hdr, inout metadata_t meta) {
    @id(0x16050001) @name(".Ingress.bitmap.bitmap_set0")
    register<bit<32>>(BITMAP_SIZE) bitmap_set0;
    @id(0x16050002) @name(".Ingress.bitmap.bitmap_set1")
    register<bit<32>>(BITMAP_SIZE) bitmap_set1;

    apply {
        bit<32> this_set;
        bit<32> other_set;
        if (hdr.ina.pool_set == 0) {
            bitmap_set0.read(this_set, meta.slot);
            if (meta.restart == 1) {
                this_set = 0;
            }
            bitmap_set0.write(meta.slot, this_set | meta.worker_bit);
            if (meta.loose == 0) {
                bitmap_set1.read(other_set, meta.slot);
                bitmap_set1.write(meta.slot, other_set & ~meta.worker_bit);
            }
        } else {
            bitmap_set1.read(this_set, meta.slot);
            if (meta.restart == 1) {
                this_set = 0;
            }
            bitmap_set1.write(meta.slot, this_set | meta.worker_bit);
            if (meta.loose == 0) {
                bitmap_set0.read(other_set, meta.slot);
                bitmap_set0.write(meta.slot, other_set & ~meta.worker_bit);
            }
        }
        if ((this_set & meta.worker_bit) != 0) {
            meta.seen = 1;
        }
    }
}

#endif  // _INA_BITMAP_P4_
