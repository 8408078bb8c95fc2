//! Doubles as a server writes them in its replies (and reads them: [`ServerDoubles`]). A score the proxy computes (ZUNION and
//! ZINTER across slots, `session::cluster::merge`) must read byte for byte as the server's
//! own would, and servers differ:
//!
//! - [`DoubleText::G17`]: Redis before 7.2 writes C's `%.17g` (`0.10000000000000001`,
//!   `1e+21`).
//! - [`DoubleText::Shortest`]: Redis 7.2 and later and Valkey write a double that is an integer
//!   within ±2^62 as that integer, any other as the digits of the Grisu2 algorithm (Florian
//!   Loitsch, "Printing Floating-Point Numbers Quickly and Accurately with Integers", 2010)
//!   with 64-bit significands and cached powers of ten every 8th power, laid out plainly
//!   or in scientific notation by their own rule (`0.1`, `1e-7` but `0.000001`, `1e+20`,
//!   `1.2345678901234567e+4`).
//!
//! Written here rather than taken from a crate: the shortest-digit crates (`ryu`, the
//! standard library's `{}`) print the shortest digits that read back the same, where Grisu2
//! prints a longer form for a few doubles in a thousand, and none lays digits out as these
//! servers do; a score whose text differed from the server's would be a silent difference.
//! `tests/cluster_cross_slot.rs` compares this module's text with every server of the
//! matrix for tens of thousands of random doubles.

/// How a server writes doubles in its replies and reads them in arguments, where the
/// proxy computes what the server would (ZUNION and ZINTER across slots).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ServerDoubles {
    /// How its replies write a double.
    pub(crate) text: DoubleText,
    /// Whether it reads a hexadecimal float (`0x1p-3`) as a number: Redis does (`strtod`),
    /// Valkey 9.1 refuses it (its parser reads decimals only).
    pub(crate) hex: bool,
}

impl ServerDoubles {
    /// The server named `name` (`redis`, `valkey`) at `version`; `None` for a server the
    /// proxy has not measured.
    pub(crate) fn of_server(name: &str, version: (u32, u32, u32)) -> Option<ServerDoubles> {
        let text = DoubleText::of_server(name, version)?;
        // Valkey before 9.1 is not measured here: refusing a hexadecimal weight its parser
        // might take costs a CROSSSLOT the client could avoid, taking one it refuses would
        // answer a command the server refuses.
        Some(ServerDoubles {
            text,
            hex: name == "redis",
        })
    }
}

/// How a server writes a double in a reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DoubleText {
    /// Redis before 7.2: `%.17g`.
    G17,
    /// Redis 7.2+ and Valkey: an integer as one, else Grisu2's digits in the servers' layout.
    Shortest,
}

impl DoubleText {
    /// How the server named `name` (`redis`, `valkey`) at `version` writes doubles; `None`
    /// for a server the proxy has not measured.
    pub(crate) fn of_server(name: &str, version: (u32, u32, u32)) -> Option<DoubleText> {
        match name {
            "redis" if version < (7, 2, 0) => Some(DoubleText::G17),
            // Valkey began as Redis 7.2.4.
            "redis" | "valkey" => Some(DoubleText::Shortest),
            _ => None,
        }
    }

    /// `v` as the server writes it (`inf`, `-inf`, `nan`, `-0` included).
    pub(crate) fn write(self, v: f64) -> String {
        if v.is_nan() {
            return "nan".to_string();
        }
        if v.is_infinite() {
            return if v > 0.0 { "inf" } else { "-inf" }.to_string();
        }
        match self {
            DoubleText::G17 => g17(v),
            DoubleText::Shortest => shortest(v),
        }
    }
}

/// C's `%.17g` of a finite double: 17 significant digits, in plain notation when the
/// decimal exponent is from -4 to 16, else in scientific notation with a signed exponent of
/// at least two digits; trailing zeros of the fraction dropped, and the point with them.
fn g17(v: f64) -> String {
    // Rust's `{:.16e}` rounds exactly as glibc's printf does (correctly, half to even on the
    // exact binary value): "d.dddddddddddddddde±x".
    let scientific = format!("{:.16e}", v);
    let (mantissa, exponent) = scientific.split_once('e').unwrap_or((&scientific, "0"));
    let exponent: i32 = exponent.parse().unwrap_or(0);
    let (sign, mantissa) = match mantissa.strip_prefix('-') {
        Some(m) => ("-", m),
        None => ("", mantissa),
    };
    let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    let trim = |s: String| -> String {
        if s.contains('.') {
            s.trim_end_matches('0').trim_end_matches('.').to_string()
        } else {
            s
        }
    };
    if (-4..17).contains(&exponent) {
        let plain = if exponent >= 0 {
            let point = (exponent + 1) as usize;
            format!("{}.{}", &digits[..point], &digits[point..])
        } else {
            format!("0.{}{digits}", "0".repeat((-exponent - 1) as usize))
        };
        format!("{sign}{}", trim(plain))
    } else {
        let body = trim(format!("{}.{}", &digits[..1], &digits[1..]));
        let esign = if exponent < 0 { '-' } else { '+' };
        format!("{sign}{body}e{esign}{:02}", exponent.abs())
    }
}

/// A finite double as Redis 7.2+ and Valkey write it (their `d2string`).
fn shortest(v: f64) -> String {
    if v == 0.0 {
        return if v.is_sign_negative() { "-0" } else { "0" }.to_string();
    }
    // An integer within ±2^62 (`LLONG_MAX / 2` as a double) is written as one.
    let bound = (i64::MAX / 2) as f64;
    if (-bound..=bound).contains(&v) {
        let whole = v as i64;
        if whole as f64 == v {
            return whole.to_string();
        }
    }
    let (digits, exponent) = grisu2(v.abs());
    lay_out(&digits, exponent, v.is_sign_negative())
}

/// A 64-bit significand and its binary exponent: `f × 2^e`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Binary {
    f: u64,
    e: i32,
}

/// The implicit leading bit of a normal double's significand.
const HIDDEN: u64 = 1 << 52;

impl Binary {
    /// A positive finite double exactly.
    fn of(v: f64) -> Binary {
        let bits = v.to_bits();
        let fraction = bits & (HIDDEN - 1);
        match ((bits >> 52) & 0x7ff) as i32 {
            0 => Binary {
                f: fraction,
                e: -1074,
            },
            biased => Binary {
                f: fraction + HIDDEN,
                e: biased - 1075,
            },
        }
    }

    /// The same value with its significand's top bit set.
    fn normalized(self) -> Binary {
        let mut n = self;
        while n.f & HIDDEN == 0 {
            n.f <<= 1;
            n.e -= 1;
        }
        Binary {
            f: n.f << 11,
            e: n.e - 11,
        }
    }

    /// The midpoints between this double and its neighbours (below, above), both at the
    /// upper one's normalized exponent.
    fn boundaries(self) -> (Binary, Binary) {
        let mut upper = Binary {
            f: (self.f << 1) + 1,
            e: self.e - 1,
        };
        while upper.f & (HIDDEN << 1) == 0 {
            upper.f <<= 1;
            upper.e -= 1;
        }
        upper.f <<= 10;
        upper.e -= 10;
        // The gap below a power of two is half the gap above it.
        let shift = if self.f == HIDDEN { 2 } else { 1 };
        let lower_e = self.e - shift;
        let lower = Binary {
            f: ((self.f << shift) - 1) << (lower_e - upper.e),
            e: upper.e,
        };
        (lower, upper)
    }

    /// The product, its significand the high 64 bits of the 128-bit one, rounded half up.
    fn times(self, other: Binary) -> Binary {
        let product = u128::from(self.f) * u128::from(other.f) + (1u128 << 63);
        Binary {
            f: (product >> 64) as u64,
            e: self.e + other.e + 64,
        }
    }
}

/// `10^(FIRST_POWER + 8i)` rounded to the nearest 64-bit significand, `(f, e)` for `f × 2^e`:
/// Grisu's cached powers. Generated with exact rational arithmetic (`python3`: `Fraction(10)
/// ** k` scaled into [2^63, 2^64), rounded half to even), and checked by
/// `cached_powers_are_the_powers_of_ten`.
const POWERS: [(u64, i32); 87] = [
    (18054884314459144840, -1220),
    (13451937075301367670, -1193),
    (10022474136428063862, -1166),
    (14934650266808366570, -1140),
    (11127181549972568877, -1113),
    (16580792590934885855, -1087),
    (12353653155963782858, -1060),
    (18408377700990114895, -1034),
    (13715310171984221708, -1007),
    (10218702384817765436, -980),
    (15227053142812498563, -954),
    (11345038669416679861, -927),
    (16905424996341287883, -901),
    (12595523146049147757, -874),
    (9384396036005875287, -847),
    (13983839803942852151, -821),
    (10418772551374772303, -794),
    (15525180923007089351, -768),
    (11567161174868858868, -741),
    (17236413322193710309, -715),
    (12842128665889583758, -688),
    (9568131466127621947, -661),
    (14257626930069360058, -635),
    (10622759856335341974, -608),
    (15829145694278690180, -582),
    (11793632577567316726, -555),
    (17573882009934360870, -529),
    (13093562431584567480, -502),
    (9755464219737475723, -475),
    (14536774485912137811, -449),
    (10830740992659433045, -422),
    (16139061738043178685, -396),
    (12024538023802026127, -369),
    (17917957937422433684, -343),
    (13349918974505688015, -316),
    (9946464728195732843, -289),
    (14821387422376473014, -263),
    (11042794154864902060, -236),
    (16455045573212060422, -210),
    (12259964326927110867, -183),
    (18268770466636286478, -157),
    (13611294676837538539, -130),
    (10141204801825835212, -103),
    (15111572745182864684, -77),
    (11258999068426240000, -50),
    (16777216000000000000, -24),
    (12500000000000000000, 3),
    (9313225746154785156, 30),
    (13877787807814456755, 56),
    (10339757656912845936, 83),
    (15407439555097886824, 109),
    (11479437019748901445, 136),
    (17105694144590052135, 162),
    (12744735289059618216, 189),
    (9495567745759798747, 216),
    (14149498560666738074, 242),
    (10542197943230523224, 269),
    (15709099088952724970, 295),
    (11704190886730495818, 322),
    (17440603504673385349, 348),
    (12994262207056124023, 375),
    (9681479787123295682, 402),
    (14426529090290212157, 428),
    (10748601772107342003, 455),
    (16016664761464807395, 481),
    (11933345169920330789, 508),
    (17782069995880619868, 534),
    (13248674568444952270, 561),
    (9871031767461413346, 588),
    (14708983551653345445, 614),
    (10959046745042015199, 641),
    (16330252207878254650, 667),
    (12166986024289022870, 694),
    (18130221999122236476, 720),
    (13508068024458167312, 747),
    (10064294952495520794, 774),
    (14996968138956309548, 800),
    (11173611982879273257, 827),
    (16649979327439178909, 853),
    (12405201291620119593, 880),
    (9242595204427927429, 907),
    (13772540099066387757, 933),
    (10261342003245940623, 960),
    (15290591125556738113, 986),
    (11392378155556871081, 1013),
    (16975966327722178521, 1039),
    (12648080533535911531, 1066),
];

/// The decimal exponent of `POWERS[0]`; each next entry is 8 powers of ten up.
const FIRST_POWER: i32 = -348;

/// The cached power of ten that brings a significand at binary exponent `e` into the range
/// where digit generation works (the product's exponent in [-60, -32]), and its decimal
/// exponent.
fn cached_power(e: i32) -> (Binary, i32) {
    // An estimate from log10(2), truncated as C truncates, then stepped to the range.
    let estimate = (f64::from(-(e + 87)) * 0.301_029_995_663_981_14) as i32;
    let mut i = (estimate - FIRST_POWER) / 8;
    loop {
        let (f, pe) = POWERS[i as usize];
        let scaled = e + pe + 64;
        if scaled < -60 {
            i += 1;
        } else if scaled > -32 {
            i -= 1;
        } else {
            return (Binary { f, e: pe }, FIRST_POWER + i * 8);
        }
    }
}

/// Grisu2's digits of a positive finite double and the decimal exponent of the last one:
/// `v ≈ digits × 10^exponent`.
fn grisu2(v: f64) -> (Vec<u8>, i32) {
    let exact = Binary::of(v);
    let (lower, upper) = exact.boundaries();
    let (power, k) = cached_power(upper.e);
    let w = exact.normalized().times(power);
    let mut upper = upper.times(power);
    let mut lower = lower.times(power);
    // One unit inward on each side: the products may be off by one.
    lower.f += 1;
    upper.f -= 1;
    let mut digits = Vec::with_capacity(18);
    let exponent = generate(w, upper, lower, &mut digits) - k;
    (digits, exponent)
}

/// Powers of ten from 10^0, for the digit loops.
const TENS: [u64; 20] = {
    let mut t = [1u64; 20];
    let mut i = 1;
    while i < 20 {
        t[i] = t[i - 1] * 10;
        i += 1;
    }
    t
};

/// Generates the digits of `upper` down to where the interval (`lower`, `upper`) holds the
/// number they make, then moves the last digit toward `w`. Returns the decimal exponent of
/// the last digit before the cached power's is applied.
fn generate(w: Binary, upper: Binary, lower: Binary, digits: &mut Vec<u8>) -> i32 {
    let to_w = upper.f.wrapping_sub(w.f);
    let mut delta = upper.f.wrapping_sub(lower.f);
    let shift = (-upper.e) as u32;
    let one = 1u64 << shift;
    let mut integral = upper.f >> shift;
    let mut fraction = upper.f & (one - 1);
    let push = |digits: &mut Vec<u8>, digit: u64| {
        if digit != 0 || !digits.is_empty() {
            digits.push(b'0' + digit as u8);
        }
    };
    // The integral part: at most ten digits, 10^9 down to 10^0.
    for place in (0..10).rev() {
        let divisor = TENS[place];
        let digit = integral / divisor;
        push(digits, digit);
        integral -= digit * divisor;
        let rest = (integral << shift).wrapping_add(fraction);
        if rest <= delta {
            nudge(digits, delta, rest, divisor << shift, to_w);
            return place as i32;
        }
    }
    // The fraction, a digit at a time.
    let mut place = 0i32;
    loop {
        fraction = fraction.wrapping_mul(10);
        delta = delta.wrapping_mul(10);
        place -= 1;
        push(digits, fraction >> shift);
        fraction &= one - 1;
        if fraction < delta {
            let scale = TENS[(-place) as usize];
            nudge(digits, delta, fraction, one, to_w.wrapping_mul(scale));
            return place;
        }
    }
}

/// Lowers the last digit while the number stays inside the interval (`rest` below `delta`)
/// and gets closer to the exact value (`rest` grows toward `to_w`); `step` is one unit of
/// the last digit.
fn nudge(digits: &mut [u8], delta: u64, mut rest: u64, step: u64, to_w: u64) {
    while rest < to_w
        && delta.wrapping_sub(rest) >= step
        && (rest.wrapping_add(step) < to_w
            || to_w.wrapping_sub(rest) > rest.wrapping_add(step).wrapping_sub(to_w))
    {
        if let Some(last) = digits.last_mut() {
            *last -= 1;
        }
        rest = rest.wrapping_add(step);
    }
}

/// Digits `d1 d2 … dn × 10^exponent` as the servers lay them out: an integer of up to seven
/// zeros past its digits plainly, a fraction whose exponent is above -7 (or whose digits
/// reach within four places of the point) plainly, anything else as `d.ddde±x` (at most 18
/// significant characters with the sign).
fn lay_out(digits: &[u8], exponent: i32, negative: bool) -> String {
    let n = digits.len() as i32;
    let magnitude = (exponent + n - 1).abs();
    let text = |d: &[u8]| String::from_utf8_lossy(d).into_owned();
    let sign = if negative { "-" } else { "" };
    if exponent >= 0 && magnitude < n + 7 {
        return format!("{sign}{}{}", text(digits), "0".repeat(exponent as usize));
    }
    if exponent < 0 && (exponent > -7 || magnitude < 4) {
        let point = n + exponent;
        return if point <= 0 {
            let zeros = "0".repeat((-point) as usize);
            format!("{sign}0.{zeros}{}", text(digits))
        } else {
            let (whole, part) = digits.split_at(point as usize);
            format!("{sign}{}.{}", text(whole), text(part))
        };
    }
    let kept = digits.len().min(18 - usize::from(negative));
    let mut out = format!("{sign}{}", char::from(digits[0]));
    if kept > 1 {
        out.push('.');
        out.push_str(&text(&digits[1..kept]));
    }
    // The exponent's sign counts the digits kept; its size, all of them.
    let esign = if exponent + kept as i32 - 1 < 0 {
        '-'
    } else {
        '+'
    };
    out.push('e');
    out.push(esign);
    out.push_str(&magnitude.to_string());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redis_7_0_writes_g17() {
        let g = |v| DoubleText::G17.write(v);
        assert_eq!(g(0.1), "0.10000000000000001");
        assert_eq!(g(1e21), "1e+21");
        assert_eq!(g(-0.0), "-0");
        assert_eq!(g(0.5), "0.5");
        assert_eq!(g(1e-5), "1.0000000000000001e-05");
        assert_eq!(g(f64::INFINITY), "inf");
        assert_eq!(g(f64::NEG_INFINITY), "-inf");
        assert_eq!(g(f64::NAN), "nan");
    }

    /// The forms docs/cluster.md quotes, as Redis 8.0.6 and Valkey 9.1.2 answered them.
    #[test]
    fn newer_servers_write_the_shortest_digits_in_their_layout() {
        let s = |v| DoubleText::Shortest.write(v);
        assert_eq!(s(0.1), "0.1");
        assert_eq!(s(1e-7), "1e-7");
        assert_eq!(s(0.000001), "0.000001");
        assert_eq!(s(1e17), "100000000000000000");
        assert_eq!(s(1e20), "1e+20");
        assert_eq!(s(12345.678901234567), "1.2345678901234567e+4");
        assert_eq!(s(-0.0), "-0");
        assert_eq!(s(0.0), "0");
        assert_eq!(s(-3.0), "-3");
        assert_eq!(s(1.5), "1.5");
        assert_eq!(s(-2.25), "-2.25");
        assert_eq!(s(f64::MAX), "1.7976931348623157e+308");
        assert_eq!(s(5e-324), "5e-324");
        assert_eq!(s(f64::INFINITY), "inf");
    }

    #[test]
    fn servers_are_read_by_name_and_version() {
        assert_eq!(
            DoubleText::of_server("redis", (7, 0, 15)),
            Some(DoubleText::G17)
        );
        assert_eq!(
            DoubleText::of_server("redis", (7, 2, 0)),
            Some(DoubleText::Shortest)
        );
        assert_eq!(
            DoubleText::of_server("valkey", (9, 1, 2)),
            Some(DoubleText::Shortest)
        );
        assert_eq!(DoubleText::of_server("keydb", (6, 3, 4)), None);
        let hex = |name| ServerDoubles::of_server(name, (9, 1, 2)).map(|d| d.hex);
        assert_eq!(hex("redis"), Some(true));
        assert_eq!(hex("valkey"), Some(false));
    }

    /// Each cached power against `10^k` computed in floating point (the table's entries are
    /// exact to the last bit; this catches an entry out of place or mistyped beyond that).
    #[test]
    fn cached_powers_are_the_powers_of_ten() {
        for (i, &(f, e)) in POWERS.iter().enumerate() {
            let k = FIRST_POWER + 8 * i as i32;
            assert!(f >= 1 << 63, "entry {i} is not normalized");
            // log2(f × 2^e) against k × log2(10).
            let log2 = (f as f64).log2() + f64::from(e);
            let want = f64::from(k) * std::f64::consts::LOG2_10;
            assert!((log2 - want).abs() < 1e-9, "entry {i}: {log2} vs {want}");
        }
    }
}
