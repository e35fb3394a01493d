//! Prometheus metrics of the admin service (`GET /metrics`): requests by method, route pattern
//! (never a raw path: ids stay out of labels) and status.

use actix_web::body::MessageBody;
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::middleware::Next;
use actix_web::web;
use prometheus::{Encoder, IntCounterVec, Opts, Registry, TextEncoder};

pub struct AdminMetrics {
    registry: Registry,
    requests: IntCounterVec,
}

impl Default for AdminMetrics {
    #[allow(
        clippy::expect_used,
        reason = "startup: static metric definitions registered once; a bad one fails every test"
    )]
    fn default() -> Self {
        let registry = Registry::new();
        let requests = IntCounterVec::new(
            Opts::new("shield_admin_requests_total", "Admin API requests by method, route pattern and status."),
            &["method", "route", "status"],
        )
        .expect("valid metric");
        registry.register(Box::new(requests.clone())).expect("unique metric");
        AdminMetrics { registry, requests }
    }
}

impl AdminMetrics {
    pub fn render(&self) -> String {
        let mut out = Vec::new();
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut out);
        String::from_utf8(out).unwrap_or_default()
    }
}

/// Middleware counting every request (wrap the app with `from_fn(track)`).
pub async fn track(
    req: ServiceRequest,
    next: Next<impl MessageBody>,
) -> Result<ServiceResponse<impl MessageBody>, actix_web::Error> {
    let method = req.method().to_string();
    let route = req.match_pattern().unwrap_or_else(|| "unmatched".into());
    let state = req.app_data::<web::Data<crate::AdminState>>().cloned();
    let response = next.call(req).await?;
    if let Some(state) = state {
        state.metrics.requests.with_label_values(&[&method, &route, response.status().as_str()]).inc();
    }
    Ok(response)
}
