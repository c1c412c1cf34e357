// Elementwise kernels over strided tensors: every input (and the output of
// `copy`) is read or written through its own strides and offset, so views
// (transpose, slice, broadcast) need no copies.
//
// params (u32 words):
//   [0] numel  [1] rank  [2] op  [3] scalar (f32 bits)
//   [4..12)  output dims
//   [12..20) a strides   [20] a offset
//   [21..29) b strides   [29] b offset
//   [30..38) out strides [38] out offset (only `copy` writes strided)

@group(0) @binding(0) var<storage, read> params: array<u32>;
@group(0) @binding(1) var<storage, read> a: array<f32>;
@group(0) @binding(2) var<storage, read> b: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

// element() comes from common.wgsl (prepended by the backend).

const SQRT_2_OVER_PI: f32 = 0.7978846;
const GELU_CUBIC: f32 = 0.044715;

// Storage offsets of element i in a, b and out.
fn offsets(i: u32) -> vec3<u32> {
    var rest = i;
    var oa = params[20];
    var ob = params[29];
    var oo = params[38];
    let rank = params[1];
    for (var k = 0u; k < rank; k++) {
        let axis = rank - 1u - k;
        let d = params[4u + axis];
        let index = rest % d;
        rest = rest / d;
        oa += index * params[12u + axis];
        ob += index * params[21u + axis];
        oo += index * params[30u + axis];
    }
    return vec3<u32>(oa, ob, oo);
}

fn unary_op(op: u32, x: f32) -> f32 {
    switch op {
        case 0u: { return -x; }
        case 1u: { return exp(x); }
        case 2u: { return log(x); }
        case 3u: { return sqrt(x); }
        case 4u: { return max(x, 0.0); }
        case 5u: { return 0.5 * x * (1.0 + tanh(SQRT_2_OVER_PI * (x + GELU_CUBIC * x * x * x))); }
        case 6u: { return tanh(x); }
        default: { return 1.0 / (1.0 + exp(-x)); }
    }
}

// `saved` is the op's output for exp, sqrt, tanh, sigmoid and its input otherwise.
fn unary_backward_op(op: u32, grad: f32, saved: f32) -> f32 {
    switch op {
        case 0u: { return -grad; }
        case 1u: { return grad * saved; }
        case 2u: { return grad / saved; }
        case 3u: { return grad / (2.0 * saved); }
        case 4u: { return select(0.0, grad, saved > 0.0); }
        case 5u: {
            let x = saved;
            let t = tanh(SQRT_2_OVER_PI * (x + GELU_CUBIC * x * x * x));
            let du = SQRT_2_OVER_PI * (1.0 + 3.0 * GELU_CUBIC * x * x);
            return grad * (0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * du);
        }
        case 6u: { return grad * (1.0 - saved * saved); }
        default: { return grad * saved * (1.0 - saved); }
    }
}

fn binary_op(op: u32, x: f32, y: f32) -> f32 {
    switch op {
        case 0u: { return x + y; }
        case 1u: { return x - y; }
        case 2u: { return x * y; }
        default: { return x / y; }
    }
}

fn scalar_op(op: u32, x: f32, c: f32) -> f32 {
    switch op {
        case 0u: { return x + c; }
        case 1u: { return x * c; }
        default: { return pow(x, c); }
    }
}

@compute @workgroup_size(256)
fn unary(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let i = element(gid, groups);
    if (i >= params[0]) { return; }
    let o = offsets(i);
    out[i] = unary_op(params[2], a[o.x]);
}

@compute @workgroup_size(256)
fn unary_backward(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let i = element(gid, groups);
    if (i >= params[0]) { return; }
    let o = offsets(i);
    out[i] = unary_backward_op(params[2], a[o.x], b[o.y]);
}

@compute @workgroup_size(256)
fn binary(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let i = element(gid, groups);
    if (i >= params[0]) { return; }
    let o = offsets(i);
    out[i] = binary_op(params[2], a[o.x], b[o.y]);
}

@compute @workgroup_size(256)
fn scalar(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let i = element(gid, groups);
    if (i >= params[0]) { return; }
    let o = offsets(i);
    out[i] = scalar_op(params[2], a[o.x], bitcast<f32>(params[3]));
}

// A strided read into a strided write: contiguous copies, concatenation.
@compute @workgroup_size(256)
fn copy(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let i = element(gid, groups);
    if (i >= params[0]) { return; }
    let o = offsets(i);
    out[o.z] = a[o.x];
}

@compute @workgroup_size(256)
fn fill(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let i = element(gid, groups);
    if (i >= params[0]) { return; }
    out[i] = bitcast<f32>(params[3]);
}
