//! A small server-rendered bar chart of daily cost per route (SVG built from numbers here,
//! text escaped by the template). No chart library: the whole job is a few rectangles.

use std::collections::BTreeMap;

use chrono::NaiveDate;

use super::usd;
use crate::api::usage::UsageDay;

pub const WIDTH: f64 = 720.0;
pub const HEIGHT: f64 = 220.0;
const LEFT: f64 = 64.0;
const BOTTOM: f64 = 24.0;
const TOP: f64 = 10.0;
/// Colour classes in portal.css.
const PALETTE: usize = 6;

pub struct Bar {
    pub x: String,
    pub y: String,
    pub width: String,
    pub height: String,
    pub class: String,
    pub title: String,
}

pub struct Series {
    pub route: String,
    pub class: String,
    pub total: String,
}

pub struct Label {
    pub x: String,
    pub text: String,
}

pub struct Chart {
    pub bars: Vec<Bar>,
    pub series: Vec<Series>,
    pub x_labels: Vec<Label>,
    pub y_max: String,
    pub baseline: String,
    pub top: String,
}

/// Bars per day, one per route, heights proportional to that day's cost. `None` when no
/// route has a row in the period.
pub fn daily_cost(days: &[NaiveDate], rows: &[UsageDay]) -> Option<Chart> {
    let mut cost: BTreeMap<(&str, &str), i64> = BTreeMap::new();
    for row in rows {
        *cost.entry((row.route.as_str(), row.date.as_str())).or_default() += row.cost_micros;
    }
    let routes: Vec<&str> = {
        let mut names: Vec<&str> = cost.keys().map(|(route, _)| *route).collect();
        names.dedup();
        names
    };
    if routes.is_empty() || days.is_empty() {
        return None;
    }
    let max = cost.values().copied().max().unwrap_or(0).max(1);
    let plot_width = WIDTH - LEFT - 8.0;
    let plot_height = HEIGHT - TOP - BOTTOM;
    let slot = plot_width / days.len() as f64;
    let bar_width = (slot * 0.8 / routes.len() as f64).max(1.0);
    let mut bars = Vec::new();
    for (d, day) in days.iter().enumerate() {
        let date = day.format("%Y-%m-%d").to_string();
        for (r, route) in routes.iter().enumerate() {
            let micros = cost.get(&(*route, date.as_str())).copied().unwrap_or(0);
            if micros == 0 {
                continue;
            }
            let height = (micros as f64 / max as f64 * plot_height).max(1.0);
            bars.push(Bar {
                x: format!("{:.1}", LEFT + d as f64 * slot + slot * 0.1 + r as f64 * bar_width),
                y: format!("{:.1}", TOP + plot_height - height),
                width: format!("{bar_width:.1}"),
                height: format!("{height:.1}"),
                class: format!("series-{}", r % PALETTE),
                title: format!("{route} on {date}: {}", usd(micros)),
            });
        }
    }
    let every = days.len().div_ceil(7).max(1);
    let x_labels = days
        .iter()
        .enumerate()
        .filter(|(i, _)| i % every == 0)
        .map(|(i, day)| Label {
            x: format!("{:.1}", LEFT + i as f64 * slot + slot / 2.0),
            text: day.format("%b %-d").to_string(),
        })
        .collect();
    let series = routes
        .iter()
        .enumerate()
        .map(|(r, route)| Series {
            route: route.to_string(),
            class: format!("series-{}", r % PALETTE),
            total: usd(cost.iter().filter(|((name, _), _)| name == route).map(|(_, c)| c).sum()),
        })
        .collect();
    Some(Chart {
        bars,
        series,
        x_labels,
        y_max: usd(max),
        baseline: format!("{:.1}", TOP + plot_height),
        top: format!("{TOP:.1}"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(date: &str, route: &str, cost_micros: i64) -> UsageDay {
        UsageDay {
            date: date.into(),
            route: route.into(),
            target: "t".into(),
            calls: 1,
            ok: 1,
            errors: 0,
            failovers_from: 0,
            input_tokens: 0,
            output_tokens: 0,
            cost: 0.0,
            cost_micros,
            latency_ms_avg: 0,
            estimated: 0,
            stream_broken: 0,
            stream_resumed: 0,
            rate_limited: 0,
            key_id: None,
            key_name: None,
            metadata: None,
        }
    }

    #[test]
    fn bars_are_proportional_and_summed_per_route_and_day() {
        let days: Vec<NaiveDate> = ["2026-11-01", "2026-11-02"].iter().map(|d| d.parse().unwrap()).collect();
        let rows = [row("2026-11-01", "a", 1000), row("2026-11-01", "a", 1000), row("2026-11-02", "b", 1000)];
        let chart = daily_cost(&days, &rows).unwrap();
        assert_eq!(chart.bars.len(), 2);
        let heights: Vec<f64> = chart.bars.iter().map(|b| b.height.parse().unwrap()).collect();
        assert!((heights[0] - 2.0 * heights[1]).abs() < 0.2, "{heights:?}");
        assert_eq!(chart.y_max, "$0.002");
        assert_eq!(chart.series.iter().map(|s| s.total.as_str()).collect::<Vec<_>>(), ["$0.002", "$0.001"]);
    }

    #[test]
    fn nothing_to_draw_without_rows() {
        assert!(daily_cost(&["2026-11-01".parse().unwrap()], &[]).is_none());
    }
}
