//! `runtime::retain_freed_memory`: with glibc's defaults a freed 24 MiB buffer leaves the
//! process (resident memory drops); after the call it stays for reuse.

#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[test]
fn freed_memory_is_returned_by_default_and_kept_after_retain() {
    fn rss() -> u64 {
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        let kb = status
            .lines()
            .find(|l| l.starts_with("VmRSS:"))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap();
        kb * 1024
    }
    const MIB: u64 = 1 << 20;
    /// Resident growth while a touched 24 MiB buffer is alive, and what is left after drop.
    fn grow_and_free() -> (u64, u64) {
        let before = rss();
        let mut v = vec![1u8; 24 << 20];
        v[12345] = std::hint::black_box(2);
        let alive = rss();
        drop(std::hint::black_box(v));
        let after = rss();
        (alive.saturating_sub(before), after.saturating_sub(before))
    }
    let (alive, left) = grow_and_free();
    assert!(alive >= 20 * MIB, "buffer not resident: {alive} bytes");
    assert!(left < 4 * MIB, "default glibc kept {left} bytes after free");

    assert!(candle_mha::runtime::retain_freed_memory());
    let (alive, left) = grow_and_free();
    assert!(alive >= 20 * MIB, "buffer not resident: {alive} bytes");
    assert!(
        left >= 20 * MIB,
        "retained memory left the process: {left} bytes kept"
    );
    // Reused, not grown: a second buffer of the same size adds (almost) nothing.
    let (again, _) = grow_and_free();
    assert!(
        again < 4 * MIB,
        "second buffer grew resident memory by {again} bytes"
    );
}
