// The contiguous fast path: four elements per thread, for same-shape packed
// inputs starting at offset 0 with a multiple of 4 elements.
//
// params: [0] vec4 count  [1] op  [2] scalar (f32 bits)

@group(0) @binding(0) var<storage, read> params: array<u32>;
@group(0) @binding(1) var<storage, read> a: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> b: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> out: array<vec4<f32>>;

const SQRT_2_OVER_PI: f32 = 0.7978846;
const GELU_CUBIC: f32 = 0.044715;

fn unary_op(op: u32, x: vec4<f32>) -> vec4<f32> {
    switch op {
        case 0u: { return -x; }
        case 1u: { return exp(x); }
        case 2u: { return log(x); }
        case 3u: { return sqrt(x); }
        case 4u: { return max(x, vec4<f32>(0.0)); }
        case 5u: { return 0.5 * x * (1.0 + tanh(SQRT_2_OVER_PI * (x + GELU_CUBIC * x * x * x))); }
        case 6u: { return tanh(x); }
        default: { return 1.0 / (1.0 + exp(-x)); }
    }
}

fn binary_op(op: u32, x: vec4<f32>, y: vec4<f32>) -> vec4<f32> {
    switch op {
        case 0u: { return x + y; }
        case 1u: { return x - y; }
        case 2u: { return x * y; }
        default: { return x / y; }
    }
}

@compute @workgroup_size(256)
fn unary4(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let i = element(gid, groups);
    if (i >= params[0]) { return; }
    out[i] = unary_op(params[1], a[i]);
}

@compute @workgroup_size(256)
fn binary4(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let i = element(gid, groups);
    if (i >= params[0]) { return; }
    out[i] = binary_op(params[1], a[i], b[i]);
}

@compute @workgroup_size(256)
fn scalar4(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let i = element(gid, groups);
    if (i >= params[0]) { return; }
    let c = bitcast<f32>(params[2]);
    switch params[1] {
        case 0u: { out[i] = a[i] + c; }
        case 1u: { out[i] = a[i] * c; }
        default: { out[i] = pow(a[i], vec4<f32>(c)); }
    }
}
