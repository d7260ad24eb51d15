//! Netlink error helpers shared by ferro-cni's dataplane and ferro-netd's executor.

/// errno values the callers treat as "already so" or "already gone".
pub const ENOENT: i32 = 2;
pub const ESRCH: i32 = 3;
pub const EEXIST: i32 = 17;
pub const ENODEV: i32 = 19;
pub const EADDRNOTAVAIL: i32 = 99;

/// The errno of a kernel's netlink error answer (None for other failures).
pub fn errno(e: &rtnetlink::Error) -> Option<i32> {
    match e {
        rtnetlink::Error::NetlinkError(m) => Some(-m.raw_code()),
        _ => None,
    }
}
