//! Usage: daily rows per route and target as the proxies flushed them (the API's report),
//! with totals and a chart of daily cost per route.

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};
use askama::Template;
use chrono::{Days, NaiveDate};

use super::chart::{self, Chart};
use super::{Ctx, PortalError, Problems, Session, render, usd};
use crate::AdminState;
use crate::api::usage::{UsageDay, UsageQuery, report};

/// The default period: the last two weeks, today included.
const DEFAULT_DAYS: u64 = 14;

/// Sums over the period's rows.
pub struct Totals {
    pub calls: u64,
    pub ok: u64,
    pub errors: u64,
    pub failovers_from: u64,
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub cost_micros: i64,
}

#[derive(Template)]
#[template(path = "usage.html")]
struct UsagePage {
    ctx: Ctx,
    from: String,
    to: String,
    rows: Vec<UsageDay>,
    totals: Totals,
    chart: Option<Chart>,
    width: f64,
    height: f64,
    problems: Problems,
}

impl UsagePage {
    /// Micro-dollars for people, in the template.
    fn usd(&self, micros: &i64) -> String {
        usd(*micros)
    }
}

#[derive(serde::Deserialize)]
pub struct PeriodQuery {
    from: Option<String>,
    to: Option<String>,
}

pub async fn page(
    req: HttpRequest,
    state: web::Data<AdminState>,
    session: Session,
    query: web::Query<PeriodQuery>,
) -> Result<HttpResponse, PortalError> {
    let today = chrono::Utc::now().date_naive();
    let to = query.to.clone().filter(|t| !t.is_empty()).unwrap_or_else(|| today.format("%Y-%m-%d").to_string());
    let from = query.from.clone().filter(|f| !f.is_empty()).unwrap_or_else(|| {
        let start = today.checked_sub_days(Days::new(DEFAULT_DAYS - 1)).unwrap_or(today);
        start.format("%Y-%m-%d").to_string()
    });
    let api_query =
        UsageQuery { from: Some(from.clone()), to: Some(to.clone()), route: None, group_by: None, key: None };
    let (rows, problems) = match report(&state, &session.principal, &api_query).await {
        Ok(report) => (report.rows, Problems::default()),
        Err(err) => (Vec::new(), Problems::from_api(err, &[])?),
    };
    let chart = period(&from, &to).and_then(|days| chart::daily_cost(&days, &rows));
    let totals = Totals {
        calls: rows.iter().map(|r| r.calls).sum(),
        ok: rows.iter().map(|r| r.ok).sum(),
        errors: rows.iter().map(|r| r.errors).sum(),
        failovers_from: rows.iter().map(|r| r.failovers_from).sum(),
        input_tokens: rows.iter().map(|r| r.input_tokens).sum(),
        output_tokens: rows.iter().map(|r| r.output_tokens).sum(),
        cost_micros: rows.iter().map(|r| r.cost_micros).sum(),
    };
    let status = problems.status.unwrap_or(StatusCode::OK);
    let page = UsagePage {
        ctx: session.ctx(&req, "usage"),
        from,
        to,
        rows,
        totals,
        chart,
        width: chart::WIDTH,
        height: chart::HEIGHT,
        problems,
    };
    Ok(render(status, &page.ctx, &page))
}

/// Every day of a valid period (the API has already refused invalid ones).
fn period(from: &str, to: &str) -> Option<Vec<NaiveDate>> {
    let (from, to) = (from.parse::<NaiveDate>().ok()?, to.parse::<NaiveDate>().ok()?);
    let days: Vec<NaiveDate> = from.iter_days().take_while(|d| *d <= to).take(95).collect();
    Some(days)
}
