//! RFC 3339 timestamps parsed and re-formatted the way Go's `time.Time` does.

use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::error::WireError;

/// A timestamp parsed the way Go's `time.Time.UnmarshalJSON` parses RFC 3339 (its strict
/// fast path), kept with its civil fields and UTC offset so it re-formats like Go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GoTime {
    year: i64,
    month: u32,
    day: u32,
    hour: u32,
    minute: u32,
    second: u32,
    nanosecond: u32,
    offset_seconds: i32,
}

impl GoTime {
    /// Parses `YYYY-MM-DDTHH:MM:SS[.fraction](Z|±HH:MM)`: fields range-checked (day against
    /// the month, no leap second), fraction of any length truncated to nanoseconds like Go.
    /// Returns `None` for anything else.
    pub fn parse_rfc3339(s: &str) -> Option<Self> {
        fn num(b: &[u8]) -> Option<u32> {
            b.iter().try_fold(0u32, |acc, &c| {
                c.is_ascii_digit().then(|| acc * 10 + u32::from(c - b'0'))
            })
        }
        let b = s.as_bytes();
        if b.len() < 19
            || b[4] != b'-'
            || b[7] != b'-'
            || b[10] != b'T'
            || b[13] != b':'
            || b[16] != b':'
        {
            return None;
        }
        let year = i64::from(num(&b[0..4])?);
        let month = num(&b[5..7]).filter(|m| (1..=12).contains(m))?;
        let day = num(&b[8..10]).filter(|d| *d >= 1 && *d <= days_in_month(year, month))?;
        let hour = num(&b[11..13]).filter(|h| *h <= 23)?;
        let minute = num(&b[14..16]).filter(|m| *m <= 59)?;
        let second = num(&b[17..19]).filter(|s| *s <= 59)?;
        let mut rest = &b[19..];
        let mut nanosecond = 0;
        if rest.len() >= 2 && rest[0] == b'.' && rest[1].is_ascii_digit() {
            let digits = rest[1..].iter().take_while(|c| c.is_ascii_digit()).count();
            let kept = &rest[1..1 + digits.min(9)];
            nanosecond = num(kept)? * 10u32.pow(9 - kept.len() as u32);
            rest = &rest[1 + digits..];
        }
        let offset_seconds = match rest {
            b"Z" => 0,
            [sign @ (b'+' | b'-'), h1, h2, b':', m1, m2] => {
                let oh = num(&[*h1, *h2]).filter(|h| *h <= 23)?;
                let om = num(&[*m1, *m2]).filter(|m| *m <= 59)?;
                let secs = (oh * 3600 + om * 60) as i32;
                if *sign == b'-' {
                    -secs
                } else {
                    secs
                }
            }
            _ => return None,
        };
        Some(Self {
            year,
            month,
            day,
            hour,
            minute,
            second,
            nanosecond,
            offset_seconds,
        })
    }

    /// The instant `secs` + `nanos` after the Unix epoch, in UTC. `nanos` must be below 10⁹.
    pub fn from_unix(secs: i64, nanos: u32) -> Option<Self> {
        if nanos >= 1_000_000_000 {
            return None;
        }
        let days = secs.div_euclid(86_400);
        let sod = secs.rem_euclid(86_400) as u32;
        let (year, month, day) = civil_from_days(days);
        Some(Self {
            year,
            month,
            day,
            hour: sod / 3600,
            minute: sod / 60 % 60,
            second: sod % 60,
            nanosecond: nanos,
            offset_seconds: 0,
        })
    }

    /// `t` in UTC (times before 1970 are allowed).
    pub fn from_system_time(t: SystemTime) -> Option<Self> {
        match t.duration_since(UNIX_EPOCH) {
            Ok(d) => Self::from_unix(i64::try_from(d.as_secs()).ok()?, d.subsec_nanos()),
            Err(e) => {
                let back = e.duration();
                let mut secs = -i64::try_from(back.as_secs()).ok()?;
                let mut nanos = back.subsec_nanos();
                if nanos > 0 {
                    secs -= 1;
                    nanos = 1_000_000_000 - nanos;
                }
                Self::from_unix(secs, nanos)
            }
        }
    }

    /// Seconds and nanoseconds since the Unix epoch of this instant.
    pub fn unix_timestamp(&self) -> (i64, u32) {
        let days = days_from_civil(self.year, self.month, self.day);
        let secs = days * 86_400
            + i64::from(self.hour) * 3600
            + i64::from(self.minute) * 60
            + i64::from(self.second)
            - i64::from(self.offset_seconds);
        (secs, self.nanosecond)
    }

    /// This instant as a [`SystemTime`] (`None` if the platform cannot represent it).
    pub fn to_system_time(&self) -> Option<SystemTime> {
        let (secs, nanos) = self.unix_timestamp();
        if secs >= 0 {
            UNIX_EPOCH.checked_add(Duration::new(secs.unsigned_abs(), nanos))
        } else {
            UNIX_EPOCH
                .checked_sub(Duration::from_secs(secs.unsigned_abs()))?
                .checked_add(Duration::from_nanos(u64::from(nanos)))
        }
    }

    /// The same instant with offset zero (Go `t.UTC()`).
    pub fn to_utc(&self) -> Self {
        let (secs, nanos) = self.unix_timestamp();
        Self::from_unix(secs, nanos).expect("nanoseconds are below one second")
    }

    /// The UTC offset in seconds east of UTC.
    pub fn offset_seconds(&self) -> i32 {
        self.offset_seconds
    }

    /// Go `t.Format(time.RFC3339Nano)` as `json.Marshal` writes it: fraction trimmed of
    /// trailing zeros and omitted when zero, `Z` for a zero offset else `±HH:MM`.
    /// `None` when the year is outside `0..=9999` (Go's `MarshalJSON` refuses those).
    pub fn to_rfc3339_nano(&self) -> Option<String> {
        if !(0..=9999).contains(&self.year) {
            return None;
        }
        let mut s = format!(
            "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}",
            self.year, self.month, self.day, self.hour, self.minute, self.second
        );
        if self.nanosecond != 0 {
            let frac = format!("{:09}", self.nanosecond);
            s.push('.');
            s.push_str(frac.trim_end_matches('0'));
        }
        if self.offset_seconds == 0 {
            s.push('Z');
        } else {
            let sign = if self.offset_seconds < 0 { '-' } else { '+' };
            let minutes = self.offset_seconds.unsigned_abs() / 60;
            if minutes / 60 >= 24 {
                return None;
            }
            s.push_str(&format!("{sign}{:02}:{:02}", minutes / 60, minutes % 60));
        }
        Some(s)
    }
}

impl fmt::Display for GoTime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.to_rfc3339_nano() {
            Some(s) => f.write_str(&s),
            None => write!(f, "<time out of range>"),
        }
    }
}

fn is_leap(year: i64) -> bool {
    year % 4 == 0 && (year % 100 != 0 || year % 400 == 0)
}

pub(super) fn days_in_month(year: i64, month: u32) -> u32 {
    match month {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        2 if is_leap(year) => 29,
        _ => 28,
    }
}

/// Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's algorithm).
pub(super) fn days_from_civil(year: i64, month: u32, day: u32) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = i64::from((month + 9) % 12);
    let doy = (153 * mp + 2) / 5 + i64::from(day) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The proleptic Gregorian (year, month, day) of `days` since 1970-01-01 (the inverse of
/// `days_from_civil`).
pub fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = (if mp < 10 { mp + 3 } else { mp - 9 }) as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// The string Go signs for a `time.Time` field: the parsed time re-formatted, offset kept.
pub(super) fn signed_time(field: &'static str, value: &str) -> Result<String, WireError> {
    GoTime::parse_rfc3339(value)
        .and_then(|t| t.to_rfc3339_nano())
        .ok_or_else(|| WireError::BadTime {
            field,
            value: value.to_owned(),
        })
}

/// The string Go signs for `t.UTC().Format(RFC3339Nano)`.
pub(super) fn signed_time_utc(field: &'static str, value: &str) -> Result<String, WireError> {
    GoTime::parse_rfc3339(value)
        .and_then(|t| t.to_utc().to_rfc3339_nano())
        .ok_or_else(|| WireError::BadTime {
            field,
            value: value.to_owned(),
        })
}
