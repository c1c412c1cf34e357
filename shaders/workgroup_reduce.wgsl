// Tree reductions over a 256-thread workgroup; prepended to the modules that
// reduce rows. Call from uniform control flow: they hold barriers.

var<workgroup> scratch: array<f32, 256>;

fn reduce_sum(lid: u32, v: f32) -> f32 {
    scratch[lid] = v;
    workgroupBarrier();
    for (var s = 128u; s > 0u; s >>= 1u) {
        if (lid < s) { scratch[lid] += scratch[lid + s]; }
        workgroupBarrier();
    }
    let total = scratch[0];
    workgroupBarrier();
    return total;
}

fn reduce_max(lid: u32, v: f32) -> f32 {
    scratch[lid] = v;
    workgroupBarrier();
    for (var s = 128u; s > 0u; s >>= 1u) {
        if (lid < s) { scratch[lid] = max(scratch[lid], scratch[lid + s]); }
        workgroupBarrier();
    }
    let best = scratch[0];
    workgroupBarrier();
    return best;
}
