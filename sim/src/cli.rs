//! Parsers and bounds of the command line's values.

use pinpool_sim::workload::MAX_SCALE;

/// Most devices a run may use.
pub const MAX_DEVICES: u64 = 64;
/// Most prover threads per device.
pub const MAX_PROVERS_PER_DEVICE: u64 = 64;
/// Most prover threads in all (devices times provers per device).
pub const MAX_PROVERS: usize = 1024;
/// Most segments per prover.
pub const MAX_SEGMENTS: u64 = 100_000;
/// Most arenas, or staging buffers, per segment.
pub const MAX_BUFFERS: u64 = 1024;
/// Most cleaner workers (pinpool's own bound).
pub const MAX_CLEANER_THREADS: u64 = 256;
/// Most runs of each strategy.
pub const MAX_REPEAT: i64 = 1000;
/// The largest cap on pooled bytes, in GiB (1 PiB).
pub const MAX_POOLED_GIB: f64 = (1u64 << 20) as f64;

/// A finite number.
fn parse_finite(text: &str) -> Result<f64, String> {
    let value: f64 = text
        .trim()
        .parse()
        .map_err(|_| format!("`{text}` is not a number"))?;
    if value.is_finite() {
        Ok(value)
    } else {
        Err(format!("`{text}` is not a finite number"))
    }
}

/// `--scale`: a finite factor in `(0, MAX_SCALE]`.
pub fn parse_scale(text: &str) -> Result<f64, String> {
    let scale = parse_finite(text)?;
    if scale <= 0.0 {
        return Err(format!("the scale must be above 0, got {scale}"));
    }
    if scale > MAX_SCALE {
        return Err(format!(
            "the scale must be at most {MAX_SCALE} (the profile's largest buffer, 2 GiB, \
             then reaches pinpool's largest size class, 1 TiB), got {scale}"
        ));
    }
    Ok(scale)
}

/// `--pinpool-conf`: `PINPOOL_CONF` pairs, checked strictly (the error
/// names the bad pair).
pub fn parse_conf(text: &str) -> Result<String, String> {
    pinpool::Pool::builder()
        .try_conf(text)
        .map(|_| text.to_string())
        .map_err(|e| e.to_string())
}

/// `--max-pooled-gib`'s value: a cap in bytes, or `None` for pinpool's
/// own (see [`parse_cap`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cap(pub Option<usize>);

/// [`parse_cap`] for the command line.
pub fn parse_cap_arg(text: &str) -> Result<Cap, String> {
    parse_cap(text).map(Cap)
}

/// `--max-pooled-gib`: a cap in GiB, returned in bytes; at least one page,
/// at most [`MAX_POOLED_GIB`]; or `default`: pinpool's own (a cap that
/// follows the working set), `None`.
pub fn parse_cap(text: &str) -> Result<Option<usize>, String> {
    if text.eq_ignore_ascii_case("default") {
        return Ok(None);
    }
    let gib = parse_finite(text)?;
    if gib <= 0.0 {
        return Err(format!("the cap must be above 0 GiB, got {gib}"));
    }
    if gib > MAX_POOLED_GIB {
        return Err(format!(
            "the cap must be at most {MAX_POOLED_GIB} GiB (1 PiB), got {gib}"
        ));
    }
    check_cap((gib * (1u64 << 30) as f64) as usize).map(Some)
}

/// `--speed`: a finite factor above 0.
pub fn parse_speed(text: &str) -> Result<f64, String> {
    let speed = parse_finite(text)?;
    if speed <= 0.0 {
        return Err(format!("the speed must be above 0, got {speed}"));
    }
    Ok(speed)
}

/// `--target`: a percentage above 0 and at most 100, returned as a
/// fraction.
pub fn parse_target(text: &str) -> Result<f64, String> {
    let percent = parse_finite(text.trim().strip_suffix('%').unwrap_or(text))?;
    if percent <= 0.0 || percent > 100.0 {
        return Err(format!(
            "the target must be above 0% and at most 100%, got {percent}"
        ));
    }
    Ok(percent / 100.0)
}

/// `--cap-factor`: a finite factor above 0.
pub fn parse_cap_factor(text: &str) -> Result<f64, String> {
    let factor = parse_finite(text)?;
    if factor <= 0.0 {
        return Err(format!("the cap factor must be above 0, got {factor}"));
    }
    Ok(factor)
}

/// The cap `--cap-factor factor` sets: `factor` times the working-set
/// bound `bound` (bytes), rounded down, within the bounds of
/// `--max-pooled-gib`.
pub fn cap_from_factor(factor: f64, bound: u64) -> Result<usize, String> {
    let bytes = factor * bound as f64;
    if bytes > MAX_POOLED_GIB * (1u64 << 30) as f64 {
        return Err(format!(
            "--cap-factor {factor} times the working-set bound ({bound} bytes) exceeds \
             {MAX_POOLED_GIB} GiB (1 PiB)"
        ));
    }
    check_cap(bytes as usize).map_err(|e| {
        format!("--cap-factor {factor} times the working-set bound ({bound} bytes): {e}")
    })
}

/// A cap of `bytes`, if it holds at least one page.
fn check_cap(bytes: usize) -> Result<usize, String> {
    let page = page_size();
    if bytes < page {
        return Err(format!(
            "the cap must hold at least one page ({page} bytes), got {bytes} bytes"
        ));
    }
    Ok(bytes)
}

/// The size of a memory page.
fn page_size() -> usize {
    // SAFETY: `sysconf` only reads a system setting.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(page).unwrap_or(4096)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scales() {
        assert_eq!(parse_scale("0.5"), Ok(0.5));
        assert_eq!(parse_scale("512"), Ok(512.0));
        for bad in ["0", "-1", "NaN", "inf", "-inf", "1e300", "513", "x", ""] {
            assert!(parse_scale(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn caps() {
        assert_eq!(parse_cap("4"), Ok(Some(4 << 30)));
        assert_eq!(parse_cap("0.5"), Ok(Some(512 << 20)));
        assert_eq!(parse_cap("Default"), Ok(None));
        for bad in ["0", "-4", "NaN", "inf", "1e-9", "2e6", "four"] {
            assert!(parse_cap(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn cap_factors() {
        assert_eq!(parse_cap_factor("1.25"), Ok(1.25));
        for bad in ["0", "-1", "NaN", "inf", "x", ""] {
            assert!(parse_cap_factor(bad).is_err(), "{bad}");
        }
        assert_eq!(cap_from_factor(1.25, 4 << 30), Ok(5 << 30));
        assert_eq!(cap_from_factor(0.5, 3 << 20), Ok(3 << 19));
        assert!(cap_from_factor(1e-9, 1 << 30).is_err());
        assert!(cap_from_factor(1e300, 1 << 30).is_err());
    }
}
