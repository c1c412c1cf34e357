// Reductions over the middle axis of a packed (outer, len, inner) tensor:
// one workgroup per output element, threads striding over the axis, then a
// tree reduction in workgroup memory.
//
// params: [0] outer  [1] len  [2] inner  [3] op (0 sum, 1 mean, 2 max)

@group(0) @binding(0) var<storage, read> params: array<u32>;
@group(0) @binding(1) var<storage, read> a: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

var<workgroup> scratch: array<f32, 256>;

fn combine(op: u32, x: f32, y: f32) -> f32 {
    return select(x + y, max(x, y), op == 2u);
}

@compute @workgroup_size(256)
fn reduce(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>,
          @builtin(local_invocation_id) lid: vec3<u32>) {
    let row = wid.y * groups.x + wid.x;
    let len = params[1];
    let inner = params[2];
    let op = params[3];
    let valid = row < params[0] * inner;
    let o = row / max(inner, 1u);
    let i = row % max(inner, 1u);
    var acc = select(0.0, -3.4028235e38, op == 2u);
    if (valid) {
        for (var l = lid.x; l < len; l += 256u) {
            acc = combine(op, acc, a[(o * len + l) * inner + i]);
        }
    }
    scratch[lid.x] = acc;
    workgroupBarrier();
    for (var s = 128u; s > 0u; s >>= 1u) {
        if (lid.x < s) {
            scratch[lid.x] = combine(op, scratch[lid.x], scratch[lid.x + s]);
        }
        workgroupBarrier();
    }
    if (valid && lid.x == 0u) {
        out[row] = select(scratch[0], scratch[0] / f32(len), op == 1u);
    }
}
