//! The Redis records both services touch, each with its one encode/decode beside the key names
//! ([`crate::keys`]): the proxy writes `gw_health`, `gw_usage`, `gw_spend` and the `gw_events`
//! stream; the admin (API, portal and webhook deliverer) reads them. Neither side formats a field name or parses a value on its own, so a
//! new field cannot be written by one and dropped by the other: the round-trip tests below fail
//! first. Decoding is lenient where the stores are shared with older processes (a row that
//! does not parse is skipped by the reader, never an error for the caller); a `gw_events` entry
//! that does not decode is an [`events::DecodeError`] naming the field, for the deliverer to log.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use crate::usage::UsageRow;

/// Separates the two names in a hash field (`target|process`, `route|target`). Neither names
/// may contain it: target ids and route names are checked by [`crate::names`].
const SEPARATOR: char = '|';

fn pair(a: &str, b: &str) -> String {
    let mut field = String::with_capacity(a.len() + b.len() + 1);
    field.push_str(a);
    field.push(SEPARATOR);
    field.push_str(b);
    field
}

/// `gw_health:{tenant}`: one field per (target, proxy process), a JSON [`HealthRecord`].
pub mod health {
    use super::*;

    pub fn field(target: &str, process: &str) -> String {
        pair(target, process)
    }

    /// `target|process` → (target, process): target ids cannot hold the separator, so the
    /// first one splits.
    pub fn parse_field(field: &str) -> Option<(&str, &str)> {
        field.split_once(SEPARATOR)
    }

    /// One process's view of one target's health.
    #[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
    pub struct HealthRecord {
        /// `closed`, `open`, `half_open` or `exhausted`.
        pub state: String,
        pub failures: u64,
        pub last_error: Option<String>,
        /// Unix seconds of the last success.
        pub last_ok_at: Option<i64>,
        /// Unix seconds of this view.
        pub at: i64,
        pub process: String,
    }

    impl HealthRecord {
        pub fn encode(&self) -> String {
            serde_json::to_string(self).unwrap_or_default()
        }

        pub fn decode(value: &str) -> Option<HealthRecord> {
            serde_json::from_str(value).ok()
        }

        /// How bad the state is, for "the worst view across processes": open or out of
        /// quota, then half-open, then closed.
        pub fn severity(&self) -> u8 {
            match self.state.as_str() {
                "open" | "exhausted" => 2,
                "half_open" => 1,
                _ => 0,
            }
        }
    }
}

/// `gw_usage:{tenant}:{yyyymmdd}`: one field per (route, target), a JSON [`UsageRow`] that the
/// merge script adds to.
pub mod usage {
    use super::*;

    pub fn field(route: &str, target: &str) -> String {
        pair(route, target)
    }

    /// `route|target` → (route, target): route names cannot hold the separator.
    pub fn parse_field(field: &str) -> Option<(&str, &str)> {
        field.split_once(SEPARATOR)
    }

    /// The counters of a [`UsageRow`], in the order [`counters`] gives them and the merge
    /// script adds them: the script's own list of names is made from this one.
    pub const COUNTERS: [&str; 12] = [
        "calls",
        "ok",
        "errors",
        "failovers_from",
        "input_tokens",
        "output_tokens",
        "cost_micros",
        "latency_ms_sum",
        "estimated",
        "stream_broken",
        "stream_resumed",
        "rate_limited",
    ];

    /// The row's counters in [`COUNTERS`] order, as the merge script's argument. An exhaustive
    /// destructuring: a field added to `UsageRow` does not compile here until it is listed.
    pub fn counters(row: &UsageRow) -> [i64; 12] {
        let UsageRow {
            calls,
            ok,
            errors,
            failovers_from,
            input_tokens,
            output_tokens,
            cost_micros,
            latency_ms_sum,
            estimated,
            stream_broken,
            stream_resumed,
            rate_limited,
        } = *row;
        let n = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        [
            n(calls),
            n(ok),
            n(errors),
            n(failovers_from),
            n(input_tokens),
            n(output_tokens),
            cost_micros,
            n(latency_ms_sum),
            n(estimated),
            n(stream_broken),
            n(stream_resumed),
            n(rate_limited),
        ]
    }

    /// A stored row (what the merge script wrote). `None` when it is not a row.
    pub fn decode(value: &str) -> Option<UsageRow> {
        serde_json::from_str(value).ok()
    }

    /// Merges a tenant's usage rows into `gw_usage` (JSON counters per `route|target`), adds
    /// each route's cost to `gw_spend`, and for every route whose month total reached its
    /// budget claims the month's alert with HSETNX — in one script, so processes flushing at
    /// once never lose an increment and exactly one of them wins an alert. Every key carries
    /// the tenant's hash tag: the script stays in one Redis Cluster slot.
    ///
    /// The same script keeps each key's usage and spend (issue 32) and the tenant's month
    /// total: a spend entry names its hash and field, and the alert field it claims (a route's
    /// name, `key:<id>`, `tenant:`; route names cannot hold `:`).
    ///
    /// ARGV[1] is JSON `{usage: [[key index, field, counters]], spend: [[spend key index,
    /// field, micros, budget micros (0: none), alert key index, alert field, month, seed key
    /// index?]], usage_ttl, spend_ttl, now}`; it returns `[[alert field, month total, month]]`
    /// for the alerts it won. A total that does not exist yet is seeded from the sum of the
    /// seed hash's fields less this entry's micros (the tenant's total from its route spend,
    /// whose entries come first: a month's spend before totals were kept counts too).
    pub fn merge_script() -> String {
        let names: Vec<String> = COUNTERS.iter().map(|n| format!("\"{n}\"")).collect();
        MERGE_USAGE.replace("{{COUNTERS}}", &names.join(","))
    }

    const MERGE_USAGE: &str = r#"
local args = cjson.decode(ARGV[1])
local names = {{{COUNTERS}}}
for _, u in ipairs(args.usage) do
  local key = KEYS[u[1]]
  local current = redis.call('HGET', key, u[2])
  local decoded = {}
  if current then decoded = cjson.decode(current) end
  local parts = {}
  for i, name in ipairs(names) do
    parts[#parts + 1] = string.format('"%s":%.0f', name, (tonumber(decoded[name]) or 0) + u[3][i])
  end
  redis.call('HSET', key, u[2], '{' .. table.concat(parts, ',') .. '}')
  redis.call('EXPIRE', key, args.usage_ttl)
end
local winners = {}
for _, s in ipairs(args.spend) do
  local key = KEYS[s[1]]
  if s[8] and redis.call('HEXISTS', key, s[2]) == 0 then
    local sum = 0
    for _, v in ipairs(redis.call('HVALS', KEYS[s[8]])) do sum = sum + (tonumber(v) or 0) end
    redis.call('HSET', key, s[2], string.format('%.0f', sum - s[3]))
  end
  local total = redis.call('HINCRBY', key, s[2], string.format('%.0f', s[3]))
  redis.call('EXPIRE', key, args.spend_ttl)
  if s[4] > 0 and total >= s[4] then
    if redis.call('HSETNX', KEYS[s[5]], s[6], args.now) == 1 then
      redis.call('EXPIRE', KEYS[s[5]], args.spend_ttl)
      winners[#winners + 1] = {s[6], tostring(total), s[7]}
    end
  end
end
return winners
"#;
}

/// `gw_spend:{tenant}:{yyyymm}`: one integer field per route, the month's spend in micro-USD
/// (HINCRBY by the merge script). `gw_key_spend:{tenant}:{yyyymm}` holds the same per key id,
/// `gw_tenant_spend:{tenant}:{yyyymm}` the tenant's total in field [`spend::TOTAL`].
pub mod spend {
    use super::*;

    /// The one field of `gw_tenant_spend`.
    pub const TOTAL: &str = "total";

    /// The field a budget alert claims in `gw_budget_alerted` (a route's is its name).
    pub fn key_alert(key_id: &str) -> String {
        format!("key:{key_id}")
    }

    pub const TENANT_ALERT: &str = "tenant:";

    /// The month's spend by route from the hash's fields; a field that is not an integer
    /// counts as nothing.
    pub fn decode(fields: Vec<(String, String)>) -> HashMap<String, i64> {
        fields.into_iter().filter_map(|(route, micros)| Some((route, micros.trim().parse().ok()?))).collect()
    }
}

/// `gw_events`: a stream of [`events::GatewayEvent`]s, one entry each, with the fields
/// [`events::FIELDS`]. The proxy XADDs them, the admin's webhook deliverer reads them.
pub mod events {
    /// The event's id (a UUID): the webhook body's `id` and the base of `X-Shield-Delivery`.
    pub const ID: &str = "id";
    pub const TENANT: &str = "tenant";
    /// The event's kind, one of [`KINDS`].
    pub const TYPE: &str = "type";
    /// Unix seconds, decimal.
    pub const AT: &str = "at";
    /// The kind's details, compact JSON.
    pub const DATA: &str = "data";
    /// An entry's fields, in the order [`GatewayEvent::fields`] writes them.
    pub const FIELDS: [&str; 5] = [ID, TENANT, TYPE, AT, DATA];

    /// A route's month spend reached its budget (claimed once per route and month).
    pub const BUDGET_EXCEEDED: &str = "budget_exceeded";
    /// A target's circuit opened (at most once per target per 10 minutes per process).
    pub const GATEWAY_TARGET_DOWN: &str = "gateway_target_down";
    /// The kinds there are: the ones a webhook may subscribe to.
    pub const KINDS: [&str; 2] = [BUDGET_EXCEEDED, GATEWAY_TARGET_DOWN];

    /// One `gw_events` entry.
    #[derive(Debug, Clone, PartialEq)]
    pub struct GatewayEvent {
        pub id: String,
        pub tenant: String,
        /// The `type` field.
        pub kind: String,
        /// Unix seconds.
        pub at: i64,
        pub data: serde_json::Value,
    }

    /// Why a `gw_events` entry is not a [`GatewayEvent`].
    #[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
    pub enum DecodeError {
        #[error("gw_events entry has no `{0}` field")]
        Missing(&'static str),
        #[error("gw_events entry's `{field}` field {reason}")]
        Garbled { field: &'static str, reason: String },
    }

    fn garbled(field: &'static str, reason: impl Into<String>) -> DecodeError {
        DecodeError::Garbled { field, reason: reason.into() }
    }

    impl GatewayEvent {
        /// The entry's field/value pairs for XADD, [`FIELDS`] in order.
        pub fn fields(&self) -> [(&'static str, String); 5] {
            [
                (ID, self.id.clone()),
                (TENANT, self.tenant.clone()),
                (TYPE, self.kind.clone()),
                (AT, self.at.to_string()),
                (DATA, self.data.to_string()),
            ]
        }

        /// An entry from its field/value pairs (a stream reply's map, or a list of pairs).
        /// Fields it does not know are ignored; of a repeated field the first counts. Every
        /// field of [`FIELDS`] must be there: `id`, `tenant` and `type` non-empty UTF-8, `at`
        /// an integer, `data` JSON.
        pub fn decode<K: AsRef<str>, V: AsRef<[u8]>>(
            entry: impl IntoIterator<Item = (K, V)>,
        ) -> Result<GatewayEvent, DecodeError> {
            let mut values: [Option<V>; 5] = Default::default();
            for (name, value) in entry {
                if let Some(i) = FIELDS.iter().position(|field| *field == name.as_ref())
                    && let Some(slot) = values.get_mut(i)
                    && slot.is_none()
                {
                    *slot = Some(value);
                }
            }
            let [id, tenant, kind, at, data] = values;
            let text = |field: &'static str, value: Option<V>| -> Result<String, DecodeError> {
                let value = value.ok_or(DecodeError::Missing(field))?;
                let text = std::str::from_utf8(value.as_ref()).map_err(|_| garbled(field, "is not UTF-8"))?;
                Ok(text.to_string())
            };
            let non_empty = |field: &'static str, value: Option<V>| -> Result<String, DecodeError> {
                let text = text(field, value)?;
                if text.is_empty() { Err(garbled(field, "is empty")) } else { Ok(text) }
            };
            let id = non_empty(ID, id)?;
            let tenant = non_empty(TENANT, tenant)?;
            let kind = non_empty(TYPE, kind)?;
            let at_text = text(AT, at)?;
            let at =
                at_text.parse().map_err(|_| garbled(AT, format!("is not Unix seconds: {:?}", shorten(&at_text))))?;
            let data =
                serde_json::from_str(&text(DATA, data)?).map_err(|err| garbled(DATA, format!("is not JSON: {err}")))?;
            Ok(GatewayEvent { id, tenant, kind, at, data })
        }
    }

    /// At most 40 characters of a bad value, for an error message.
    fn shorten(value: &str) -> &str {
        value.char_indices().nth(40).and_then(|(end, _)| value.get(..end)).unwrap_or(value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn health_round_trips() {
        let record = health::HealthRecord {
            state: "half_open".into(),
            failures: 5,
            last_error: Some("server_error".into()),
            last_ok_at: Some(1_764_000_000),
            at: 1_764_000_100,
            process: "host-42-abc123".into(),
        };
        assert_eq!(health::HealthRecord::decode(&record.encode()), Some(record.clone()));
        let field = health::field("openai-4o", &record.process);
        assert_eq!(health::parse_field(&field), Some(("openai-4o", "host-42-abc123")));
        assert_eq!(record.severity(), 1);
        assert_eq!(health::HealthRecord::decode("not json"), None);
    }

    /// A row whose every counter differs survives counters → the script's JSON → decode.
    #[test]
    fn usage_round_trips_through_the_merge_scripts_format() {
        let row = UsageRow {
            calls: 1,
            ok: 2,
            errors: 3,
            failovers_from: 4,
            input_tokens: 5,
            output_tokens: 6,
            cost_micros: 7,
            latency_ms_sum: 8,
            estimated: 9,
            stream_broken: 10,
            stream_resumed: 11,
            rate_limited: 12,
        };
        // What the script writes: `{"name":value,...}` over the names it was given.
        let values = usage::counters(&row);
        let written: Vec<String> =
            usage::COUNTERS.iter().zip(values).map(|(name, value)| format!("\"{name}\":{value}")).collect();
        let written = format!("{{{}}}", written.join(","));
        assert_eq!(usage::decode(&written), Some(row), "{written}");
        assert_eq!(usage::parse_field(&usage::field("smart", "openai-4o")), Some(("smart", "openai-4o")));
    }

    /// Every field serde knows is a counter the script carries, and no other.
    #[test]
    fn the_scripts_names_are_the_rows_fields() {
        let value = serde_json::to_value(UsageRow::default()).unwrap();
        let mut fields: Vec<&str> = value.as_object().unwrap().keys().map(String::as_str).collect();
        let mut counters = usage::COUNTERS.to_vec();
        fields.sort_unstable();
        counters.sort_unstable();
        assert_eq!(fields, counters);
        let script = usage::merge_script();
        assert!(script.contains(r#"local names = {"calls","ok","#), "{script}");
        assert!(!script.contains("{{COUNTERS}}"));
    }

    #[test]
    fn spend_decodes_leniently() {
        let fields = vec![("smart".to_string(), "1500".to_string()), ("junk".to_string(), "x".to_string())];
        let spend = spend::decode(fields);
        assert_eq!((spend.get("smart"), spend.get("junk")), (Some(&1500), None));
    }

    fn event() -> events::GatewayEvent {
        events::GatewayEvent {
            id: "6f1c2d4e-0000-4000-8000-000000000001".into(),
            tenant: "acme".into(),
            kind: events::BUDGET_EXCEEDED.into(),
            at: 1_764_000_000,
            data: serde_json::json!({"route": "smart", "month": "202611", "spend": 12.5, "limit": 10.0}),
        }
    }

    /// What the proxy XADDs is what the deliverer reads, through the bytes Redis hands back.
    #[test]
    fn events_round_trip() {
        let event = event();
        let fields = event.fields();
        let names: Vec<&str> = fields.iter().map(|(name, _)| *name).collect();
        assert_eq!(names, events::FIELDS);
        let entry: Vec<(String, Vec<u8>)> =
            fields.iter().map(|(name, value)| (name.to_string(), value.clone().into_bytes())).collect();
        assert_eq!(events::GatewayEvent::decode(entry), Ok(event.clone()));
        // From a stream reply's map too, with a field it does not know.
        let mut map: HashMap<String, Vec<u8>> =
            fields.into_iter().map(|(name, value)| (name.to_string(), value.into_bytes())).collect();
        map.insert("added_later".into(), b"x".to_vec());
        assert_eq!(events::GatewayEvent::decode(&map), Ok(event));
    }

    /// The wire format the end-to-end tests and older processes read: these names, `at` in
    /// decimal seconds, `data` compact JSON.
    #[test]
    fn events_keep_their_wire_format() {
        let fields = event().fields();
        assert_eq!(fields[0], ("id", "6f1c2d4e-0000-4000-8000-000000000001".to_string()));
        assert_eq!(fields[1], ("tenant", "acme".to_string()));
        assert_eq!(fields[2], ("type", "budget_exceeded".to_string()));
        assert_eq!(fields[3], ("at", "1764000000".to_string()));
        assert_eq!(fields[4].0, "data");
        let data: serde_json::Value = serde_json::from_str(&fields[4].1).unwrap();
        assert_eq!(data["route"], "smart");
        assert!(!fields[4].1.contains(' '), "compact: {}", fields[4].1);
        assert_eq!(events::KINDS, ["budget_exceeded", "gateway_target_down"]);
    }

    /// A missing or garbled field is an error naming it, never a panic or a defaulted event.
    #[test]
    fn events_that_do_not_decode_say_why() {
        use events::{DecodeError, GatewayEvent};
        let entry = |drop: &str, replace: Option<(&str, &[u8])>| -> Vec<(String, Vec<u8>)> {
            event()
                .fields()
                .into_iter()
                .filter(|(name, _)| *name != drop)
                .map(|(name, value)| match replace {
                    Some((field, bad)) if field == name => (name.to_string(), bad.to_vec()),
                    _ => (name.to_string(), value.into_bytes()),
                })
                .collect()
        };
        for field in events::FIELDS {
            assert_eq!(GatewayEvent::decode(entry(field, None)), Err(DecodeError::Missing(field)));
        }
        let garbled = |field: &str, value: &[u8]| GatewayEvent::decode(entry("", Some((field, value))));
        assert!(matches!(garbled("at", b"soon"), Err(DecodeError::Garbled { field: "at", .. })));
        assert!(matches!(garbled("data", b"{\"route\":"), Err(DecodeError::Garbled { field: "data", .. })));
        assert!(matches!(garbled("tenant", b"\xff\xfe"), Err(DecodeError::Garbled { field: "tenant", .. })));
        assert!(matches!(garbled("type", b""), Err(DecodeError::Garbled { field: "type", .. })));
        // A long bad value is cut short in the message, at a character boundary.
        let long = "٣".repeat(100);
        let message = garbled("at", long.as_bytes()).unwrap_err().to_string();
        assert!(message.starts_with("gw_events entry's `at` field is not Unix seconds"), "{message}");
        assert!(message.len() < 150, "{message}");
        assert_eq!(GatewayEvent::decode(Vec::<(String, Vec<u8>)>::new()), Err(DecodeError::Missing("id")));
    }
}
