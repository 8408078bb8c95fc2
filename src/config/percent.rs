//! Shares written as percentages (`10%`, `0.5%`), read once for every setting that takes one
//! (a rule's `share`, `mirror.compare.share`), so they all accept and refuse the same text.

/// The largest share: 100% in hundredths of a percent.
pub(crate) const WHOLE: u64 = 10_000;

/// `10%`, `0.5%`, `100%`, or a bare number of percent: hundredths of a percent, or why not.
pub(crate) fn parse(text: &str) -> Result<u64, String> {
    let number = text.trim().trim_end_matches('%').trim();
    let bad =
        || format!("`{text}` is not a share: write a percentage from 0% to 100% (`10%`, `0.5%`)");
    let (whole, frac) = number.split_once('.').unwrap_or((number, ""));
    if whole.is_empty() || frac.len() > 2 || !frac.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    let whole: u64 = whole.parse().map_err(|_| bad())?;
    let frac: u64 = if frac.is_empty() {
        0
    } else {
        format!("{frac:0<2}").parse().map_err(|_| bad())?
    };
    let hundredths = whole.checked_mul(100).ok_or_else(bad)? + frac;
    if hundredths > WHOLE {
        return Err(bad());
    }
    Ok(hundredths)
}
