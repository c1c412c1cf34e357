// Shared by every kernel module; the backend prepends it (WGSL has no includes).

// The flat element index of a 256-wide 1-D dispatch folded into two
// dimensions past the 65,535-workgroup limit of one.
fn element(gid: vec3<u32>, groups: vec3<u32>) -> u32 {
    return (gid.y * groups.x * 256u) + gid.x;
}
