/* onearmed.bpf.h: where a one-armed server's answers go (ina.bpf.c's cfg.one_armed;
 * included by it): the next hop toward a worker, learned from the worker's own packets or
 * asked of the kernel. */

/* One-armed: the source MAC each worker's packets arrive with (the worker's, or the
 * router's in front of it), by (IPv4, UDP port): where its results go next. */
struct {
    __uint(type, BPF_MAP_TYPE_LRU_HASH);
    __uint(max_entries, 32768);
    __type(key, __u64);
    __type(value, __u64);
} learned SEC(".maps");

/* next_hop's question to the kernel, per CPU: on the stack, its 64 bytes were more than
 * the RoCEv2 replies' call chain had left (roce.bpf.h). */
struct {
    __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
    __uint(max_entries, 1);
    __type(key, __u32);
    __type(value, struct bpf_fib_lookup);
} fib_scratch SEC(".maps");

static __always_inline __u64 endpoint_key(__be32 ip, __be16 port)
{
    return ((__u64)ip << 16) | port;
}

/* One-armed: the MAC of the next hop toward the worker at `dst_ip`:`dst_port`. First the
 * one its own packets came from (learned: symmetric routing, as a learning switch
 * assumes); else the kernel's routes and neighbour table (bpf_fib_lookup, which the
 * kernel answers only where the interface forwards: net.ipv4.conf.IFACE.forwarding). 0,
 * or -1 when neither knows (counted: no_route). */
static __always_inline int next_hop(struct __sk_buff *skb, __be32 own_ip, __be32 dst_ip,
                                    __be16 dst_port, __u8 *mac)
{
    __u64 key = endpoint_key(dst_ip, dst_port);
    __u64 *known = bpf_map_lookup_elem(&learned, &key);
    if (known) {
        __builtin_memcpy(mac, known, ETH_ALEN);
        return 0;
    }
    __u32 zero = 0;
    struct bpf_fib_lookup *f = bpf_map_lookup_elem(&fib_scratch, &zero);
    if (!f)
        return -1;
    __builtin_memset(f, 0, sizeof(*f));
    f->family = 2; /* AF_INET */
    f->l4_protocol = IPPROTO_UDP;
    f->tot_len = IP_BYTES + UDP_BYTES + INA_HEADER_SIZE + INA_PAYLOAD_BYTES;
    f->ipv4_src = own_ip;
    f->ipv4_dst = dst_ip;
    f->ifindex = skb->ifindex;
    if (bpf_fib_lookup(skb, f, sizeof(*f), BPF_FIB_LOOKUP_OUTPUT) != BPF_FIB_LKUP_RET_SUCCESS)
        return -1;
    if (f->ifindex != skb->ifindex)
        return -1;
    __builtin_memcpy(mac, f->dmac, ETH_ALEN);
    return 0;
}

/* One-armed: remember the MAC a worker's packet came from (written only when it changed). */
static __always_inline void learn(const struct origin *o)
{
    __u64 key = endpoint_key(o->src_ip, o->src_port);
    __u64 mac = 0;
    __builtin_memcpy(&mac, o->src_mac, ETH_ALEN);
    __u64 *known = bpf_map_lookup_elem(&learned, &key);
    if (!known || *known != mac)
        bpf_map_update_elem(&learned, &key, &mac, BPF_ANY);
}
