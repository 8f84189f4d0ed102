//! Who holds a kernel lock, from `/proc/locks`: inspection without taking the lock (a
//! probe with `flock` would hold it for a moment and refuse a real acquisition meanwhile).

/// The process holding a `flock` on the file with device `dev` and inode `ino`, if any.
/// `Err`: `/proc/locks` cannot be read.
pub(crate) fn flock_holder(dev: u64, ino: u64) -> std::io::Result<Option<u32>> {
    let text = std::fs::read_to_string("/proc/locks")?;
    let want = (
        u64::from(rustix::fs::major(dev)),
        u64::from(rustix::fs::minor(dev)),
        ino,
    );
    Ok(text.lines().find_map(|line| holder_in(line, want)))
}

/// The holder's pid when `line` is a granted `FLOCK` on `(major, minor, inode)`; waiting
/// requests (`->`) are not holders.
fn holder_in(line: &str, want: (u64, u64, u64)) -> Option<u32> {
    let mut fields = line.split_whitespace();
    let _ordinal = fields.next()?;
    let kind = fields.next()?;
    if kind != "FLOCK" {
        return None;
    }
    let _advisory = fields.next()?;
    let _mode = fields.next()?;
    let pid = fields.next()?.parse().ok()?;
    let mut id = fields.next()?.split(':');
    let major = u64::from_str_radix(id.next()?, 16).ok()?;
    let minor = u64::from_str_radix(id.next()?, 16).ok()?;
    let ino = id.next()?.parse().ok()?;
    ((major, minor, ino) == want).then_some(pid)
}

#[cfg(test)]
mod tests {
    use super::holder_in;

    #[test]
    fn reads_granted_flocks_and_skips_the_rest() {
        let want = (0xfd, 0x01, 1234);
        assert_eq!(
            holder_in("1: FLOCK  ADVISORY  WRITE 4242 fd:01:1234 0 EOF", want),
            Some(4242)
        );
        assert_eq!(
            holder_in("1: -> FLOCK  ADVISORY  WRITE 7 fd:01:1234 0 EOF", want),
            None
        );
        assert_eq!(
            holder_in("2: POSIX  ADVISORY  WRITE 9 fd:01:1234 0 EOF", want),
            None
        );
        assert_eq!(
            holder_in("3: FLOCK  ADVISORY  WRITE 9 fd:01:1235 0 EOF", want),
            None
        );
        assert_eq!(holder_in("", want), None);
    }
}
