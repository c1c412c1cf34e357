// Embedding lookup and cross-entropy, which read integral f32 indices. A bad
// index (not an integer in range) sets `status` to 1; the backend reports
// it as an error at the next read.
//
// params: [0] rows (indices)  [1] width (d or classes)  [2] vocab  [3] elements

@group(0) @binding(0) var<storage, read> params: array<u32>;
@group(0) @binding(1) var<storage, read> a: array<f32>;
@group(0) @binding(2) var<storage, read> indices: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;
@group(0) @binding(4) var<storage, read_write> status: array<atomic<u32>>;
@group(0) @binding(5) var<storage, read> grad: array<f32>;

fn checked(v: f32, limit: u32) -> u32 {
    if (v < 0.0 || v >= f32(limit) || v != floor(v)) {
        atomicStore(&status[0], 1u);
        return 0u;
    }
    return u32(v);
}

// a = weight [vocab, d].
@compute @workgroup_size(256)
fn embedding(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let e = element(gid, groups);
    if (e >= params[3]) { return; }
    let d = params[1];
    let row = checked(indices[e / d], params[2]);
    out[e] = a[row * d + e % d];
}

// a = grad of the output [rows, d]; one thread per weight element.
@compute @workgroup_size(256)
fn embedding_backward(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let e = element(gid, groups);
    if (e >= params[3]) { return; }
    let d = params[1];
    let r = e / d;
    var acc = 0.0;
    for (var i = 0u; i < params[0]; i++) {
        if (checked(indices[i], params[2]) == r) {
            acc += a[i * d + e % d];
        }
    }
    out[e] = acc;
}

fn log_sum_exp(row: u32, classes: u32) -> f32 {
    var m = -3.4028235e38;
    for (var j = 0u; j < classes; j++) { m = max(m, a[row * classes + j]); }
    var s = 0.0;
    for (var j = 0u; j < classes; j++) { s += exp(a[row * classes + j] - m); }
    return m + log(s);
}

// a = logits [rows, classes]; out[row] = that row's loss.
@compute @workgroup_size(256)
fn cross_entropy_rows(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let row = element(gid, groups);
    if (row >= params[0]) { return; }
    let classes = params[1];
    let class_index = checked(indices[row], classes);
    out[row] = log_sum_exp(row, classes) - a[row * classes + class_index];
}

// a = logits, grad[0] = grad of the mean loss.
@compute @workgroup_size(256)
fn cross_entropy_backward(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let e = element(gid, groups);
    if (e >= params[3]) { return; }
    let classes = params[1];
    let row = e / classes;
    let class_index = checked(indices[row], classes);
    let p = exp(a[e] - log_sum_exp(row, classes));
    let onehot = select(0.0, 1.0, e % classes == class_index);
    out[e] = grad[0] * (p - onehot) / f32(params[0]);
}
