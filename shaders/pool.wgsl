// Max and average pooling and their gradients over planes (n·c) of h×w,
// one thread per element written. Gradients are gathers: an input element
// sums the windows that contain it (for max: those whose first maximum it is).
//
// params: [0] planes [1] h [2] w [3] oh [4] ow [5] kh [6] kw
//         [7] stride y [8] stride x [9] pad y [10] pad x [11] elements

@group(0) @binding(0) var<storage, read> params: array<u32>;
@group(0) @binding(1) var<storage, read> a: array<f32>;
@group(0) @binding(2) var<storage, read> b: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

// Index (in the plane) of the first maximum of window (oy, ox) of plane p in `b`.
fn first_max(p: u32, oy: u32, ox: u32) -> i32 {
    let H = params[1]; let W = params[2];
    var best = -1;
    var best_value = 0.0;
    for (var ky = 0u; ky < params[5]; ky++) {
        let y = i32(oy * params[7] + ky) - i32(params[9]);
        if (y < 0 || y >= i32(H)) { continue; }
        for (var kx = 0u; kx < params[6]; kx++) {
            let x = i32(ox * params[8] + kx) - i32(params[10]);
            if (x < 0 || x >= i32(W)) { continue; }
            let v = b[(p * H + u32(y)) * W + u32(x)];
            if (best < 0 || v > best_value) {
                best = y * i32(W) + x;
                best_value = v;
            }
        }
    }
    return best;
}

// a = x (read as b by first_max, so both bind x).
@compute @workgroup_size(256)
fn max_pool(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let e = element(gid, groups);
    if (e >= params[11]) { return; }
    let OH = params[3]; let OW = params[4];
    let ox = e % OW; let oy = (e / OW) % OH; let p = e / (OW * OH);
    let best = first_max(p, oy, ox);
    out[e] = select(-3.4028235e38, a[p * params[1] * params[2] + u32(max(best, 0))], best >= 0);
}

@compute @workgroup_size(256)
fn avg_pool(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let e = element(gid, groups);
    if (e >= params[11]) { return; }
    let H = params[1]; let W = params[2]; let OH = params[3]; let OW = params[4];
    let ox = e % OW; let oy = (e / OW) % OH; let p = e / (OW * OH);
    var acc = 0.0;
    for (var ky = 0u; ky < params[5]; ky++) {
        let y = i32(oy * params[7] + ky) - i32(params[9]);
        if (y < 0 || y >= i32(H)) { continue; }
        for (var kx = 0u; kx < params[6]; kx++) {
            let x = i32(ox * params[8] + kx) - i32(params[10]);
            if (x < 0 || x >= i32(W)) { continue; }
            acc += a[(p * H + u32(y)) * W + u32(x)];
        }
    }
    out[e] = acc / f32(params[5] * params[6]);
}

// Output windows (oy, ox) whose span contains input row/column `v` along one axis.
fn window_range(v: u32, k: u32, s: u32, pad: u32, count: u32) -> vec2<u32> {
    // oy·s − pad ≤ v ≤ oy·s − pad + k − 1
    let hi_num = i32(v + pad);
    let lo_num = hi_num - i32(k) + 1;
    var lo = 0u;
    if (lo_num > 0) { lo = (u32(lo_num) + s - 1u) / s; }
    let hi = min(u32(hi_num) / s + 1u, count);
    return vec2<u32>(lo, max(lo, hi));
}

// a = grad of the output, b = x; one thread per input element.
@compute @workgroup_size(256)
fn max_pool_backward(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let e = element(gid, groups);
    let H = params[1]; let W = params[2]; let OH = params[3]; let OW = params[4];
    if (e >= params[0] * H * W) { return; }
    let x = e % W; let y = (e / W) % H; let p = e / (W * H);
    let rows = window_range(y, params[5], params[7], params[9], OH);
    let cols = window_range(x, params[6], params[8], params[10], OW);
    var acc = 0.0;
    for (var oy = rows.x; oy < rows.y; oy++) {
        for (var ox = cols.x; ox < cols.y; ox++) {
            if (first_max(p, oy, ox) == i32(y * W + x)) {
                acc += a[(p * OH + oy) * OW + ox];
            }
        }
    }
    out[e] = acc;
}

// a = grad of the output.
@compute @workgroup_size(256)
fn avg_pool_backward(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let e = element(gid, groups);
    let H = params[1]; let W = params[2]; let OH = params[3]; let OW = params[4];
    if (e >= params[0] * H * W) { return; }
    let x = e % W; let y = (e / W) % H; let p = e / (W * H);
    let rows = window_range(y, params[5], params[7], params[9], OH);
    let cols = window_range(x, params[6], params[8], params[10], OW);
    var acc = 0.0;
    for (var oy = rows.x; oy < rows.y; oy++) {
        for (var ox = cols.x; ox < cols.y; ox++) {
            acc += a[(p * OH + oy) * OW + ox];
        }
    }
    out[e] = acc / f32(params[5] * params[6]);
}
