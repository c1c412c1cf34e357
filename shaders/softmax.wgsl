// Softmax and log-softmax over the middle axis of (outer, len, inner), and
// their gradients: one workgroup per row, numerically stable (the row's
// maximum is subtracted before exponentiating).
//
// params: [0] outer  [1] len  [2] inner  [3] log (0 or 1)

@group(0) @binding(0) var<storage, read> params: array<u32>;
@group(0) @binding(1) var<storage, read> a: array<f32>;
@group(0) @binding(2) var<storage, read> b: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

// reduce_sum and reduce_max come from workgroup_reduce.wgsl, element() from common.wgsl.

fn at(row: u32, l: u32) -> u32 {
    let inner = params[2];
    return ((row / inner) * params[1] + l) * inner + row % inner;
}

@compute @workgroup_size(256)
fn softmax(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>,
           @builtin(local_invocation_id) lid: vec3<u32>) {
    let row = wid.y * groups.x + wid.x;
    let valid = row < params[0] * params[2];
    let len = params[1];
    var m = -3.4028235e38;
    if (valid) {
        for (var l = lid.x; l < len; l += 256u) { m = max(m, a[at(row, l)]); }
    }
    m = reduce_max(lid.x, m);
    var s = 0.0;
    if (valid) {
        for (var l = lid.x; l < len; l += 256u) { s += exp(a[at(row, l)] - m); }
    }
    s = reduce_sum(lid.x, s);
    if (valid) {
        for (var l = lid.x; l < len; l += 256u) {
            let shifted = a[at(row, l)] - m;
            out[at(row, l)] = select(exp(shifted) / s, shifted - log(s), params[3] == 1u);
        }
    }
}

// a = grad of the output, b = the output y.
@compute @workgroup_size(256)
fn softmax_backward(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>,
                    @builtin(local_invocation_id) lid: vec3<u32>) {
    let row = wid.y * groups.x + wid.x;
    let valid = row < params[0] * params[2];
    let len = params[1];
    let log_variant = params[3] == 1u;
    var s = 0.0;
    if (valid) {
        for (var l = lid.x; l < len; l += 256u) {
            let g = a[at(row, l)];
            s += select(g * b[at(row, l)], g, log_variant);
        }
    }
    s = reduce_sum(lid.x, s);
    if (valid) {
        for (var l = lid.x; l < len; l += 256u) {
            let g = a[at(row, l)];
            let y = b[at(row, l)];
            out[at(row, l)] = select(y * (g - s), g - exp(y) * s, log_variant);
        }
    }
}
