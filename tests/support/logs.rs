//! Captures every log line the code under test emits in this process (TRACE level), so tests
//! can assert that a secret never reaches a log.

use std::io::Write;
use std::sync::{Mutex, Once};

static LOGS: Mutex<Vec<u8>> = Mutex::new(Vec::new());
static INIT: Once = Once::new();

struct Sink;

impl Write for Sink {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        LOGS.lock().expect("log buffer").extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

pub fn capture() {
    INIT.call_once(|| {
        let _ = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::TRACE)
            .with_ansi(false)
            .with_writer(|| Sink)
            .try_init();
    });
}

pub fn contains(needle: &str) -> bool {
    String::from_utf8_lossy(&LOGS.lock().expect("log buffer")).contains(needle)
}

pub fn len() -> usize {
    LOGS.lock().expect("log buffer").len()
}
