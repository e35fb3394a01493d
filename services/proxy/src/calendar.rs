//! Today's date for usage rows and month keys, formatted once a day per thread: the request
//! path asks on every call, and formatting a date each time showed in the profile.

use std::cell::RefCell;

thread_local! {
    /// `(unix day, yyyymmdd)`.
    static TODAY: RefCell<(u64, String)> = const { RefCell::new((u64::MAX, String::new())) };
}

/// Today's `yyyymmdd` (UTC).
pub fn today() -> String {
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    let day = secs / 86_400;
    TODAY.with(|cached| {
        let mut cached = cached.borrow_mut();
        if cached.0 != day {
            let midnight = chrono::DateTime::from_timestamp((day * 86_400) as i64, 0).unwrap_or_default();
            *cached = (day, midnight.format("%Y%m%d").to_string());
        }
        cached.1.clone()
    })
}

/// This month's `yyyymm` (UTC).
pub fn this_month() -> String {
    today()[..6].to_string()
}

#[cfg(test)]
mod tests {
    #[test]
    fn today_is_chronos_today() {
        assert_eq!(super::today(), chrono::Utc::now().format("%Y%m%d").to_string());
        assert_eq!(super::this_month(), chrono::Utc::now().format("%Y%m").to_string());
    }
}
