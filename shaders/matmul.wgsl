// Batched matrix product out[p] = a[p] (m×k) · b[p] (k×n), all packed
// row-major; `b` is shared by every batch when its batch stride is 0.
//
// Each workgroup computes a 64×64 tile of the output with 16×16 threads,
// each thread a 4×4 block held in registers. Every step stages a 64×16
// slice of a and a 16×64 slice of b in workgroup memory (4 loads per
// thread, coalesced), then each thread does 4×4×16 multiply-adds from it:
// 16 times the arithmetic per load and per barrier of a one-output-per-thread
// tile. Products are summed in k order, like the CPU backend.
//
// params: [0] m  [1] n  [2] k  [3] b batch stride (elements)

@group(0) @binding(0) var<storage, read> params: array<u32>;
@group(0) @binding(1) var<storage, read> a: array<f32>;
@group(0) @binding(2) var<storage, read> b: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

const TILE: u32 = 64u;
const DEPTH: u32 = 16u;
// Both stored k-major: tile_a[kk * 64 + row], tile_b[kk * 64 + column].
var<workgroup> tile_a: array<f32, 1024>;
var<workgroup> tile_b: array<f32, 1024>;

@compute @workgroup_size(16, 16)
fn matmul(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let m = params[0];
    let n = params[1];
    let k = params[2];
    let a_base = wid.z * m * k;
    let b_base = wid.z * params[3];
    let tile_row = wid.y * TILE;
    let tile_col = wid.x * TILE;
    let thread = lid.y * 16u + lid.x;
    var acc: array<array<f32, 4>, 4>;
    for (var i = 0u; i < 4u; i++) {
        for (var j = 0u; j < 4u; j++) {
            acc[i][j] = 0.0;
        }
    }
    let steps = (k + DEPTH - 1u) / DEPTH;
    for (var t = 0u; t < steps; t++) {
        for (var l = 0u; l < 4u; l++) {
            let index = thread * 4u + l;
            // a: 64 rows × 16 columns of k, row-major in the source.
            let ar = index / DEPTH;
            let ak = index % DEPTH;
            let row = tile_row + ar;
            let ka = t * DEPTH + ak;
            tile_a[ak * TILE + ar] = select(0.0, a[a_base + row * k + ka], row < m && ka < k);
            // b: 16 rows of k × 64 columns.
            let bk = index / TILE;
            let bc = index % TILE;
            let kb = t * DEPTH + bk;
            let col = tile_col + bc;
            tile_b[bk * TILE + bc] = select(0.0, b[b_base + kb * n + col], kb < k && col < n);
        }
        workgroupBarrier();
        for (var kk = 0u; kk < DEPTH; kk++) {
            var fa: array<f32, 4>;
            var fb: array<f32, 4>;
            for (var i = 0u; i < 4u; i++) {
                fa[i] = tile_a[kk * TILE + lid.y * 4u + i];
                fb[i] = tile_b[kk * TILE + lid.x * 4u + i];
            }
            for (var i = 0u; i < 4u; i++) {
                for (var j = 0u; j < 4u; j++) {
                    acc[i][j] += fa[i] * fb[j];
                }
            }
        }
        workgroupBarrier();
    }
    for (var i = 0u; i < 4u; i++) {
        let row = tile_row + lid.y * 4u + i;
        for (var j = 0u; j < 4u; j++) {
            let col = tile_col + lid.x * 4u + j;
            if (row < m && col < n) {
                out[wid.z * m * n + row * n + col] = acc[i][j];
            }
        }
    }
}
