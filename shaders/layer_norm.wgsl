// Layer norm over the last axis (rows of length d): one workgroup per row
// for the forward pass and the input gradient; one thread per column for
// the gamma and beta gradients.
//
// params: [0] rows  [1] d  [2] eps (f32 bits)

@group(0) @binding(0) var<storage, read> params: array<u32>;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> gamma: array<f32>;
@group(0) @binding(3) var<storage, read> beta: array<f32>;
@group(0) @binding(4) var<storage, read> dy: array<f32>;
@group(0) @binding(5) var<storage, read> mean_in: array<f32>;
@group(0) @binding(6) var<storage, read> rstd_in: array<f32>;
@group(0) @binding(7) var<storage, read_write> out0: array<f32>;
@group(0) @binding(8) var<storage, read_write> out1: array<f32>;
@group(0) @binding(9) var<storage, read_write> out2: array<f32>;

// reduce_sum comes from workgroup_reduce.wgsl (prepended by the backend).

// out0 = y, out1 = mean, out2 = rstd.
@compute @workgroup_size(256)
fn layer_norm(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>,
              @builtin(local_invocation_id) lid: vec3<u32>) {
    let row = wid.y * groups.x + wid.x;
    let valid = row < params[0];
    let d = params[1];
    let base = row * d;
    var s = 0.0;
    if (valid) { for (var j = lid.x; j < d; j += 256u) { s += x[base + j]; } }
    let mean = reduce_sum(lid.x, s) / f32(d);
    var v = 0.0;
    if (valid) { for (var j = lid.x; j < d; j += 256u) { let c = x[base + j] - mean; v += c * c; } }
    let rstd = 1.0 / sqrt(reduce_sum(lid.x, v) / f32(d) + bitcast<f32>(params[2]));
    if (valid) {
        for (var j = lid.x; j < d; j += 256u) {
            out0[base + j] = (x[base + j] - mean) * rstd * gamma[j] + beta[j];
        }
        if (lid.x == 0u) {
            out1[row] = mean;
            out2[row] = rstd;
        }
    }
}

// out0 = dx.
@compute @workgroup_size(256)
fn layer_norm_backward_input(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>,
                             @builtin(local_invocation_id) lid: vec3<u32>) {
    let row = wid.y * groups.x + wid.x;
    let valid = row < params[0];
    let d = params[1];
    let base = row * d;
    var m = 0.0;
    var r = 0.0;
    if (valid) { m = mean_in[row]; r = rstd_in[row]; }
    var s1 = 0.0;
    var s2 = 0.0;
    if (valid) {
        for (var j = lid.x; j < d; j += 256u) {
            let g = dy[base + j] * gamma[j];
            s1 += g;
            s2 += g * (x[base + j] - m) * r;
        }
    }
    let mean_g = reduce_sum(lid.x, s1) / f32(d);
    let mean_gx = reduce_sum(lid.x, s2) / f32(d);
    if (valid) {
        for (var j = lid.x; j < d; j += 256u) {
            let xhat = (x[base + j] - m) * r;
            out0[base + j] = r * (dy[base + j] * gamma[j] - mean_g - xhat * mean_gx);
        }
    }
}

// out0 = dgamma, out1 = dbeta; one thread per column.
@compute @workgroup_size(256)
fn layer_norm_backward_params(@builtin(global_invocation_id) gid: vec3<u32>) {
    let j = gid.x;
    let d = params[1];
    if (j >= d) { return; }
    var dg = 0.0;
    var db = 0.0;
    for (var row = 0u; row < params[0]; row++) {
        let g = dy[row * d + j];
        dg += g * (x[row * d + j] - mean_in[row]) * rstd_in[row];
        db += g;
    }
    out0[j] = dg;
    out1[j] = db;
}
