//! Today's date for usage rows and month keys, formatted once a day per thread: the request
//! path asks on every call, and formatting a date each time showed in the profile.

use std::cell::Cell;

/// A UTC day as `yyyymmdd`: a copyable value, so asking for today allocates nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Day([u8; 8]);

impl Day {
    fn of(unix_day: u64) -> Day {
        let midnight = chrono::DateTime::from_timestamp((unix_day * 86_400) as i64, 0).unwrap_or_default();
        let mut bytes = [b'0'; 8];
        let text = midnight.format("%Y%m%d").to_string();
        if text.len() == 8 {
            bytes.copy_from_slice(text.as_bytes());
        }
        Day(bytes)
    }

    pub fn as_str(&self) -> &str {
        // Always ASCII digits (written from a formatted date above).
        std::str::from_utf8(&self.0).unwrap_or("00000000")
    }

    /// `yyyymm`.
    pub fn month(&self) -> &str {
        self.as_str().get(..6).unwrap_or_default()
    }
}

impl std::ops::Deref for Day {
    type Target = str;

    fn deref(&self) -> &str {
        self.as_str()
    }
}

impl std::fmt::Display for Day {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

thread_local! {
    /// `(unix day, yyyymmdd)`.
    static TODAY: Cell<(u64, Day)> = const { Cell::new((u64::MAX, Day([b'0'; 8]))) };
}

/// Today (UTC).
pub fn today() -> Day {
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    let day = secs / 86_400;
    TODAY.with(|cached| {
        let (known, today) = cached.get();
        if known == day {
            return today;
        }
        let today = Day::of(day);
        cached.set((day, today));
        today
    })
}

/// This month's `yyyymm` (UTC).
pub fn this_month() -> String {
    today().month().to_string()
}

/// Seconds from `now` (Unix seconds) until the next calendar month starts (UTC): when a
/// monthly budget starts again.
pub fn seconds_to_month_end(now: i64) -> u64 {
    use chrono::Datelike;
    let Some(today) = chrono::DateTime::from_timestamp(now, 0) else { return 0 };
    let (year, month) = if today.month() == 12 { (today.year() + 1, 1) } else { (today.year(), today.month() + 1) };
    let next = chrono::NaiveDate::from_ymd_opt(year, month, 1).and_then(|d| d.and_hms_opt(0, 0, 0));
    next.map_or(0, |next| u64::try_from(next.and_utc().timestamp() - now).unwrap_or(0))
}

/// Unix seconds now.
pub fn unix_now() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs() as i64)
}

#[cfg(test)]
mod tests {
    #[test]
    fn today_is_chronos_today() {
        assert_eq!(super::today().to_string(), chrono::Utc::now().format("%Y%m%d").to_string());
        assert_eq!(super::this_month(), chrono::Utc::now().format("%Y%m").to_string());
    }

    #[test]
    fn a_month_ends_at_the_next_months_first_midnight() {
        // 2026-12-31T23:59:00Z → 60 s to 2027-01-01; 2026-02-01T00:00:00Z → all of February.
        assert_eq!(super::seconds_to_month_end(1_798_761_540), 60);
        assert_eq!(super::seconds_to_month_end(1_769_904_000), 28 * 86_400);
    }
}
