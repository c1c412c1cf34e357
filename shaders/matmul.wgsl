// Batched matrix product out[p] = a[p] (m×k) · b[p] (k×n), all packed
// row-major; `b` is shared by every batch when its batch stride is 0.
// 16×16 output tiles; each step stages a 16×16 tile of a and of b in
// workgroup memory, so each input element is read from storage once per tile.
//
// params: [0] m  [1] n  [2] k  [3] b batch stride (elements)

@group(0) @binding(0) var<storage, read> params: array<u32>;
@group(0) @binding(1) var<storage, read> a: array<f32>;
@group(0) @binding(2) var<storage, read> b: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

const TILE: u32 = 16u;
var<workgroup> tile_a: array<array<f32, 16>, 16>;
var<workgroup> tile_b: array<array<f32, 16>, 16>;

@compute @workgroup_size(16, 16)
fn matmul(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let m = params[0];
    let n = params[1];
    let k = params[2];
    let batch = wid.z;
    let row = wid.y * TILE + lid.y;
    let col = wid.x * TILE + lid.x;
    let a_base = batch * m * k;
    let b_base = batch * params[3];
    var acc = 0.0;
    let steps = (k + TILE - 1u) / TILE;
    for (var t = 0u; t < steps; t++) {
        let ka = t * TILE + lid.x;
        let kb = t * TILE + lid.y;
        tile_a[lid.y][lid.x] = select(0.0, a[a_base + row * k + ka], row < m && ka < k);
        tile_b[lid.y][lid.x] = select(0.0, b[b_base + kb * n + col], kb < k && col < n);
        workgroupBarrier();
        for (var i = 0u; i < TILE; i++) {
            acc += tile_a[lid.y][i] * tile_b[i][lid.x];
        }
        workgroupBarrier();
    }
    if (row < m && col < n) {
        out[batch * m * n + row * n + col] = acc;
    }
}
