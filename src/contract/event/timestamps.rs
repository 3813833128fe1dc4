//! RFC 3339 timestamps read into Unix milliseconds and written back: the common shape
//! (`2026-11-25T10:00:00Z`, fractions, offsets) read by hand, anything else by `time`.

use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

/// Parses an RFC 3339 timestamp into Unix milliseconds.
pub fn parse_rfc3339_ms(s: &str) -> Option<i64> {
    if let Some(ms) = parse_common_rfc3339_ms(s) {
        return Some(ms);
    }
    let t = OffsetDateTime::parse(s, &Rfc3339).ok()?;
    i64::try_from(t.unix_timestamp_nanos() / 1_000_000).ok()
}

/// The usual shape, `YYYY-MM-DDTHH:MM:SS[.fraction](Z|±HH:MM)`, read without the `time`
/// crate's general parser; anything else (and any value it would judge differently:
/// leap seconds, lowercase letters) is left to it.
pub(super) fn parse_common_rfc3339_ms(s: &str) -> Option<i64> {
    let b = s.as_bytes();
    let num = |r: std::ops::Range<usize>| -> Option<i64> {
        let d = b.get(r)?;
        let mut acc = 0i64;
        let mut bad = false;
        for &c in d {
            let digit = c.wrapping_sub(b'0');
            bad |= digit > 9;
            acc = acc * 10 + i64::from(digit);
        }
        (!bad).then_some(acc)
    };
    if b.len() < 20
        || b[4] != b'-'
        || b[7] != b'-'
        || b[10] != b'T'
        || b[13] != b':'
        || b[16] != b':'
    {
        return None;
    }
    let (year, month, day) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (hour, minute, second) = (num(11..13)?, num(14..16)?, num(17..19)?);
    let leap = year % 4 == 0 && (year % 100 != 0 || year % 400 == 0);
    let days_in_month = match month {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        2 if leap => 29,
        2 => 28,
        _ => return None,
    };
    if day < 1 || day > days_in_month || hour > 23 || minute > 59 || second > 59 {
        return None;
    }
    let mut i = 19;
    let mut nanos = 0i64;
    if b[i] == b'.' {
        let start = i + 1;
        i = start;
        while i < b.len() && b[i].is_ascii_digit() {
            i += 1;
        }
        let digits = i - start;
        if digits == 0 || digits > 9 {
            return None;
        }
        nanos = num(start..i)? * 10i64.pow(9 - digits as u32);
    }
    let offset_secs = match (b.get(i), b.len() - i) {
        (Some(b'Z'), 1) => 0,
        (Some(sign @ (b'+' | b'-')), 6) if b[i + 3] == b':' => {
            let (h, m) = (num(i + 1..i + 3)?, num(i + 4..i + 6)?);
            if h > 23 || m > 59 {
                return None;
            }
            let secs = h * 3600 + m * 60;
            if *sign == b'-' {
                -secs
            } else {
                secs
            }
        }
        _ => return None,
    };
    // Days since 1970-01-01 (Howard Hinnant's days_from_civil).
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let secs = days * 86_400 + hour * 3600 + minute * 60 + second - offset_secs;
    if secs >= 0 {
        // Rounding toward zero is rounding down here: no 128-bit division.
        return Some(secs * 1000 + nanos / 1_000_000);
    }
    let total_nanos = secs as i128 * 1_000_000_000 + nanos as i128;
    i64::try_from(total_nanos / 1_000_000).ok()
}

/// Unix milliseconds of 0000-01-01T00:00:00Z and of 10000-01-01T00:00:00Z: the times
/// with a four-digit year.
pub(super) const FOUR_DIGIT_YEARS_MS: std::ops::Range<i64> =
    -62_167_219_200_000..253_402_300_800_000;

/// Formats Unix milliseconds as RFC 3339 (UTC, millisecond precision).
pub fn format_rfc3339_ms(ms: i64) -> String {
    if !FOUR_DIGIT_YEARS_MS.contains(&ms) {
        return format_rfc3339_ms_by_time(ms);
    }
    // Outputs carry two times each: written digit by digit, not through `format!`.
    let (days, ms_of_day) = (ms.div_euclid(86_400_000), ms.rem_euclid(86_400_000));
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let mut out = *b"0000-00-00T00:00:00.000Z";
    let mut put = |at: usize, width: usize, mut v: i64| {
        for i in (at..at + width).rev() {
            out[i] = b'0' + (v % 10) as u8;
            v /= 10;
        }
    };
    put(0, 4, year);
    put(5, 2, month);
    put(8, 2, day);
    put(11, 2, ms_of_day / 3_600_000);
    put(14, 2, ms_of_day / 60_000 % 60);
    put(17, 2, ms_of_day / 1000 % 60);
    put(20, 3, ms_of_day % 1000);
    String::from_utf8(out.to_vec()).expect("ASCII digits and separators")
}

/// [`format_rfc3339_ms`] by the `time` crate, for the years that do not have four digits.
pub(super) fn format_rfc3339_ms_by_time(ms: i64) -> String {
    let t = OffsetDateTime::from_unix_timestamp_nanos(ms as i128 * 1_000_000)
        .unwrap_or(OffsetDateTime::UNIX_EPOCH);
    let (y, mo, d) = (t.year(), t.month() as u8, t.day());
    let (h, mi, s, milli) = (t.hour(), t.minute(), t.second(), t.millisecond());
    format!("{y:04}-{mo:02}-{d:02}T{h:02}:{mi:02}:{s:02}.{milli:03}Z")
}

/// The wall clock in Unix milliseconds, as the contract's timestamps count time (0 on a
/// clock set before 1970).
pub fn wall_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}
