/* forward.bpf.h: the forwarder of ina.bpf.c (included by it): a frame that is not INA
 * goes by its destination MAC to a port, a flood group but its ingress port, or nowhere
 * (p4/forwarder.p4's table; the soft switch's Pipeline.forward). */

static __always_inline __u64 mac_key(const __u8 *m)
{
    return ((__u64)m[0] << 40) | ((__u64)m[1] << 32) | ((__u64)m[2] << 24) |
           ((__u64)m[3] << 16) | ((__u64)m[4] << 8) | (__u64)m[5];
}

static __always_inline int flood(struct __sk_buff *skb, __u32 mgid, __u32 in_port)
{
    struct ina_group *g = bpf_map_lookup_elem(&groups, &mgid);
    if (!g)
        return TC_ACT_SHOT;
    __u32 n = g->count;
    for (__u32 i = 0; i < INA_MAX_REPLICAS; i++) {
        if (i >= n)
            break;
        g = bpf_map_lookup_elem(&groups, &mgid);
        if (!g)
            break;
        __u32 port = g->replicas[i].port;
        if (port == in_port)
            continue; /* forwarder.p4: no flooded copy back out of its ingress port */
        struct ina_port *p;
        __u32 ifindex = port_ifindex(port, &p);
        if (!ifindex || !p)
            continue;
        send_out(skb, port, ifindex, p, 0);
    }
    return TC_ACT_SHOT;
}

static __always_inline int forward_frame(struct __sk_buff *skb, __u32 in_port,
                                         struct ina_cfg *c)
{
    void *data = (void *)(long)skb->data;
    void *end = (void *)(long)skb->data_end;
    struct ethhdr *eth = data;
    if ((void *)(eth + 1) > end)
        return drop(C_NOT_FORWARDED);
    __u64 mac = mac_key(eth->h_dest);
    struct ina_fwd *f = bpf_map_lookup_elem(&forward, &mac);
    __u32 kind = f ? f->kind : c->fwd_kind;
    __u32 value = f ? f->value : c->fwd_value;
    if (kind == FWD_PORT) {
        struct ina_port *p;
        __u32 ifindex = port_ifindex(value, &p);
        if (!ifindex || !p)
            return drop(C_NOT_FORWARDED);
        count(C_FORWARDED);
        return send_out(skb, value, ifindex, p, 1);
    }
    if (kind == FWD_FLOOD) {
        count(C_FORWARDED);
        return flood(skb, value, in_port);
    }
    return drop(C_NOT_FORWARDED);
}
