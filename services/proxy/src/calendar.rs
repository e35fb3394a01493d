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

#[cfg(test)]
mod tests {
    #[test]
    fn today_is_chronos_today() {
        assert_eq!(super::today().to_string(), chrono::Utc::now().format("%Y%m%d").to_string());
        assert_eq!(super::this_month(), chrono::Utc::now().format("%Y%m").to_string());
    }
}
