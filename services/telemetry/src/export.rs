//! The span queue between the request path and the OTLP exporter.
//!
//! Hand-rolled rather than the SDK's `BatchSpanProcessor` for one reason: that processor drops
//! spans when its queue is full and only logs it, and an operator must be able to see on
//! `/metrics` that traces are being lost. The design is the SDK's own: a bounded channel
//! filled with `try_send` (a full queue drops the span, the request never waits), one OS
//! thread that batches and exports, honouring `OTEL_BSP_MAX_QUEUE_SIZE`,
//! `OTEL_BSP_MAX_EXPORT_BATCH_SIZE` and `OTEL_BSP_SCHEDULE_DELAY`. A batch the collector
//! refuses, fails or times out on (`OTEL_EXPORTER_OTLP_TIMEOUT`) is dropped and counted; it is
//! not retried. After a failure the collector is left alone for a while (1 s, doubling to
//! 30 s while it keeps failing): batches due meanwhile are dropped and counted without being
//! encoded, so a dead collector costs the cores that serve requests next to nothing.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::time::{Duration, Instant};

use opentelemetry::Context;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::error::{OTelSdkError, OTelSdkResult};
use opentelemetry_sdk::trace::{Span, SpanData, SpanExporter, SpanProcessor};

static DROPPED_QUEUE_FULL: AtomicU64 = AtomicU64::new(0);
static DROPPED_EXPORT_FAILED: AtomicU64 = AtomicU64::new(0);
static EXPORTED: AtomicU64 = AtomicU64::new(0);
/// While the collector is being left alone: until when (milliseconds since [`epoch`]; 0: not).
/// Read by `on_end`, so a span ended meanwhile is dropped where it ended, never queued: freeing
/// it on the export thread instead cost more than the span itself under load.
static LEFT_ALONE_UNTIL_MS: AtomicU64 = AtomicU64::new(0);

fn epoch() -> Instant {
    static EPOCH: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

fn now_ms() -> u64 {
    u64::try_from(epoch().elapsed().as_millis()).unwrap_or(u64::MAX)
}

/// Spans dropped: (the queue was full, the export failed).
pub fn dropped() -> (u64, u64) {
    (DROPPED_QUEUE_FULL.load(Ordering::Relaxed), DROPPED_EXPORT_FAILED.load(Ordering::Relaxed))
}

/// Spans the collector accepted.
pub fn exported() -> u64 {
    EXPORTED.load(Ordering::Relaxed)
}

#[derive(Clone, Copy, Debug)]
pub struct QueueConfig {
    pub max_queue: usize,
    pub max_batch: usize,
    pub delay: Duration,
}

impl QueueConfig {
    /// The `OTEL_BSP_*` variables, with the specification's defaults (2048, 512, 5 s).
    pub fn from_env() -> QueueConfig {
        let number = |name: &str, default: u64| {
            std::env::var(name).ok().and_then(|v| v.trim().parse::<u64>().ok()).filter(|n| *n > 0).unwrap_or(default)
        };
        let max_queue = number("OTEL_BSP_MAX_QUEUE_SIZE", 2048) as usize;
        QueueConfig {
            max_queue,
            max_batch: (number("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", 512) as usize).min(max_queue),
            delay: Duration::from_millis(number("OTEL_BSP_SCHEDULE_DELAY", 5000)),
        }
    }
}

enum Message {
    Span(Box<SpanData>),
    Resource(Resource),
    /// Export what is queued now and answer.
    Flush(SyncSender<()>),
    Shutdown(SyncSender<()>),
}

#[derive(Debug)]
pub struct Queue {
    spans: SyncSender<Message>,
    /// Flush, shutdown and resource messages: never dropped for a full span queue.
    control: SyncSender<Message>,
}

impl Queue {
    /// Starts the export thread.
    pub fn start<E: SpanExporter + 'static>(exporter: E, config: QueueConfig) -> Queue {
        let (spans, span_rx) = mpsc::sync_channel(config.max_queue);
        let (control, control_rx) = mpsc::sync_channel(8);
        let spawned = std::thread::Builder::new()
            .name("shield-otlp-export".into())
            .spawn(move || export_loop(exporter, config, span_rx, control_rx));
        if let Err(err) = spawned {
            tracing::error!(error = %err, "the trace export thread could not start; spans will be dropped");
        }
        Queue { spans, control }
    }

    fn ask(&self, message: impl FnOnce(SyncSender<()>) -> Message, timeout: Duration) -> OTelSdkResult {
        let (done, wait) = mpsc::sync_channel(1);
        self.control.try_send(message(done)).map_err(|_| OTelSdkError::AlreadyShutdown)?;
        // Wakes the export thread if it is waiting for spans.
        let _ = self.spans.try_send(Message::Resource(Resource::builder_empty().build()));
        wait.recv_timeout(timeout).map_err(|_| OTelSdkError::Timeout(timeout))
    }
}

impl SpanProcessor for Queue {
    fn on_start(&self, _span: &mut Span, _cx: &Context) {}

    fn on_end(&self, span: SpanData) {
        if LEFT_ALONE_UNTIL_MS.load(Ordering::Relaxed) > now_ms() {
            DROPPED_EXPORT_FAILED.fetch_add(1, Ordering::Relaxed);
            return;
        }
        match self.spans.try_send(Message::Span(Box::new(span))) {
            Ok(()) => {}
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
                if DROPPED_QUEUE_FULL.fetch_add(1, Ordering::Relaxed) == 0 {
                    tracing::warn!(
                        "the trace queue is full: spans are being dropped (shield_trace_spans_dropped_total)"
                    );
                }
            }
        }
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.ask(Message::Flush, Duration::from_secs(30))
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.ask(Message::Shutdown, timeout)
    }

    fn set_resource(&mut self, resource: &Resource) {
        let _ = self.control.try_send(Message::Resource(resource.clone()));
    }
}

fn export_loop<E: SpanExporter>(
    mut exporter: E,
    config: QueueConfig,
    spans: Receiver<Message>,
    control: Receiver<Message>,
) {
    let mut batch: Vec<SpanData> = Vec::with_capacity(config.max_batch);
    let mut backoff = Backoff::default();
    let mut export = |exporter: &E, batch: &mut Vec<SpanData>| send(exporter, batch, config.max_batch, &mut backoff);
    let mut due = Instant::now() + config.delay;
    loop {
        let mut stop = None;
        while let Ok(message) = control.try_recv() {
            match message {
                Message::Resource(resource) => exporter.set_resource(&resource),
                Message::Flush(done) => {
                    drain(&spans, &mut batch);
                    export(&exporter, &mut batch);
                    let _ = done.send(());
                }
                Message::Shutdown(done) => stop = Some(done),
                Message::Span(span) => batch.push(*span),
            }
        }
        if let Some(done) = stop {
            drain(&spans, &mut batch);
            export(&exporter, &mut batch);
            let _ = exporter.shutdown();
            let _ = done.send(());
            return;
        }
        match spans.recv_timeout(due.saturating_duration_since(Instant::now())) {
            Ok(Message::Span(span)) => batch.push(*span),
            Ok(_) => {}
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => {
                export(&exporter, &mut batch);
                return;
            }
        }
        if batch.len() >= config.max_batch || Instant::now() >= due {
            export(&exporter, &mut batch);
            due = Instant::now() + config.delay;
        }
    }
}

fn drain(spans: &Receiver<Message>, batch: &mut Vec<SpanData>) {
    while let Ok(message) = spans.try_recv() {
        if let Message::Span(span) = message {
            batch.push(*span);
        }
    }
}

/// How long a failing collector is left alone.
#[derive(Default)]
struct Backoff {
    until: Option<Instant>,
    wait: Duration,
}

impl Backoff {
    const FIRST: Duration = Duration::from_secs(1);
    const MOST: Duration = Duration::from_secs(30);

    fn failed(&mut self) {
        self.wait = if self.wait.is_zero() { Self::FIRST } else { (self.wait * 2).min(Self::MOST) };
        self.until = Some(Instant::now() + self.wait);
        let until = now_ms().saturating_add(u64::try_from(self.wait.as_millis()).unwrap_or(u64::MAX));
        LEFT_ALONE_UNTIL_MS.store(until, Ordering::Relaxed);
    }

    fn succeeded(&mut self) {
        *self = Backoff::default();
        LEFT_ALONE_UNTIL_MS.store(0, Ordering::Relaxed);
    }

    fn waiting(&self) -> bool {
        self.until.is_some_and(|until| Instant::now() < until)
    }
}

/// Exports `batch` in pieces of at most `max`; a piece that fails is dropped and counted, and
/// so is every piece due while the collector is being left alone.
fn send<E: SpanExporter>(exporter: &E, batch: &mut Vec<SpanData>, max: usize, backoff: &mut Backoff) {
    while !batch.is_empty() {
        let piece: Vec<SpanData> = batch.drain(..batch.len().min(max.max(1))).collect();
        let n = piece.len() as u64;
        if backoff.waiting() {
            DROPPED_EXPORT_FAILED.fetch_add(n, Ordering::Relaxed);
            continue;
        }
        match futures_executor::block_on(exporter.export(piece)) {
            Ok(()) => {
                backoff.succeeded();
                EXPORTED.fetch_add(n, Ordering::Relaxed);
            }
            Err(err) => {
                backoff.failed();
                if DROPPED_EXPORT_FAILED.fetch_add(n, Ordering::Relaxed) == 0 {
                    tracing::warn!(error = %err, spans = n, "the trace collector did not take a batch: dropped (shield_trace_spans_dropped_total)");
                } else {
                    tracing::debug!(error = %err, spans = n, "trace batch dropped");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use opentelemetry::trace::{Tracer, TracerProvider};
    use opentelemetry_sdk::trace::SdkTracerProvider;

    use super::*;

    #[derive(Debug, Default, Clone)]
    struct Recording {
        spans: Arc<Mutex<Vec<String>>>,
        fail: bool,
    }

    impl SpanExporter for Recording {
        async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
            if self.fail {
                return Err(OTelSdkError::InternalFailure("collector down".into()));
            }
            self.spans.lock().unwrap().extend(batch.into_iter().map(|s| s.name.to_string()));
            Ok(())
        }
    }

    #[test]
    fn spans_are_batched_flushed_and_failed_batches_counted() {
        let exporter = Recording::default();
        let config = QueueConfig { max_queue: 16, max_batch: 4, delay: Duration::from_secs(60) };
        let provider = SdkTracerProvider::builder().with_span_processor(Queue::start(exporter.clone(), config)).build();
        let tracer = provider.tracer("test");
        for i in 0..6 {
            tracer.in_span(format!("span {i}"), |_| {});
        }
        provider.force_flush().unwrap();
        assert_eq!(exporter.spans.lock().unwrap().len(), 6);

        let (_, failed_before) = dropped();
        let failing = SdkTracerProvider::builder()
            .with_span_processor(Queue::start(Recording { fail: true, ..Recording::default() }, config))
            .build();
        let tracer = failing.tracer("test");
        for _ in 0..3 {
            tracer.in_span("lost", |_| {});
        }
        failing.force_flush().unwrap();
        assert!(dropped().1 >= failed_before + 3);
        // The collector is now left alone: a span ended meanwhile is dropped and counted at once.
        let before = dropped().1;
        tracer.in_span("while left alone", |_| {});
        assert_eq!(dropped().1, before + 1);
        failing.shutdown().unwrap();
        provider.shutdown().unwrap();
    }
}
