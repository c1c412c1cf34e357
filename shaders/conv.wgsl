// 2-D convolution and its gradients, one thread per element written, each
// a gather (no atomics): out[n,o,oy,ox] = Σ x[n,c,oy·s−p+ky, ox·s−p+kx] · w[o,c,ky,kx].
//
// params: [0] n [1] c [2] h [3] w [4] o [5] kh [6] kw [7] oh [8] ow
//         [9] stride y [10] stride x [11] pad y [12] pad x [13] elements

@group(0) @binding(0) var<storage, read> params: array<u32>;
@group(0) @binding(1) var<storage, read> a: array<f32>;
@group(0) @binding(2) var<storage, read> b: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

// a = x, b = weight.
@compute @workgroup_size(256)
fn conv2d(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let e = element(gid, groups);
    if (e >= params[13]) { return; }
    let C = params[1]; let H = params[2]; let W = params[3]; let O = params[4];
    let KH = params[5]; let KW = params[6]; let OH = params[7]; let OW = params[8];
    let ox = e % OW; let oy = (e / OW) % OH; let o = (e / (OW * OH)) % O; let n = e / (OW * OH * O);
    var acc = 0.0;
    for (var c = 0u; c < C; c++) {
        for (var ky = 0u; ky < KH; ky++) {
            let y = i32(oy * params[9] + ky) - i32(params[11]);
            if (y < 0 || y >= i32(H)) { continue; }
            for (var kx = 0u; kx < KW; kx++) {
                let x = i32(ox * params[10] + kx) - i32(params[12]);
                if (x < 0 || x >= i32(W)) { continue; }
                acc += a[((n * C + c) * H + u32(y)) * W + u32(x)] * b[((o * C + c) * KH + ky) * KW + kx];
            }
        }
    }
    out[e] = acc;
}

// a = grad of the output, b = weight; one thread per input element.
@compute @workgroup_size(256)
fn conv2d_backward_data(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let e = element(gid, groups);
    if (e >= params[13]) { return; }
    let C = params[1]; let H = params[2]; let W = params[3]; let O = params[4];
    let KH = params[5]; let KW = params[6]; let OH = params[7]; let OW = params[8];
    let SY = params[9]; let SX = params[10];
    let x = e % W; let y = (e / W) % H; let c = (e / (W * H)) % C; let n = e / (W * H * C);
    var acc = 0.0;
    for (var ky = 0u; ky < KH; ky++) {
        let ty = i32(y + params[11]) - i32(ky);
        if (ty < 0 || u32(ty) % SY != 0u || u32(ty) / SY >= OH) { continue; }
        let oy = u32(ty) / SY;
        for (var kx = 0u; kx < KW; kx++) {
            let tx = i32(x + params[12]) - i32(kx);
            if (tx < 0 || u32(tx) % SX != 0u || u32(tx) / SX >= OW) { continue; }
            let ox = u32(tx) / SX;
            for (var o = 0u; o < O; o++) {
                acc += a[((n * O + o) * OH + oy) * OW + ox] * b[((o * C + c) * KH + ky) * KW + kx];
            }
        }
    }
    out[e] = acc;
}

// a = grad of the output, b = x; one thread per weight element.
@compute @workgroup_size(256)
fn conv2d_backward_weight(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let e = element(gid, groups);
    if (e >= params[13]) { return; }
    let N = params[0]; let C = params[1]; let H = params[2]; let W = params[3]; let O = params[4];
    let KH = params[5]; let KW = params[6]; let OH = params[7]; let OW = params[8];
    let kx = e % KW; let ky = (e / KW) % KH; let c = (e / (KW * KH)) % C; let o = e / (KW * KH * C);
    var acc = 0.0;
    for (var n = 0u; n < N; n++) {
        for (var oy = 0u; oy < OH; oy++) {
            let y = i32(oy * params[9] + ky) - i32(params[11]);
            if (y < 0 || y >= i32(H)) { continue; }
            for (var ox = 0u; ox < OW; ox++) {
                let x = i32(ox * params[10] + kx) - i32(params[12]);
                if (x < 0 || x >= i32(W)) { continue; }
                acc += a[((n * O + o) * OH + oy) * OW + ox] * b[((n * C + c) * H + u32(y)) * W + u32(x)];
            }
        }
    }
    out[e] = acc;
}
