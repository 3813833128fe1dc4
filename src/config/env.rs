//! `LOOPWARDEN_…` environment variables as configuration overrides: `LOOPWARDEN_A__B=v`
//! sets `a.b = v`, typed as TOML where it parses (librdkafka properties: always strings).

use std::sync::LazyLock;

use regex::Regex;

use super::{Errors, ENV_PREFIX, RESERVED_ENV, RESERVED_ENV_PREFIX};

/// Whether a value has the shape a service link's has.
type ValueShape = fn(&str) -> bool;

/// What the kubelet sets (service links, on by default) for a Service whose name starts
/// with `loopwarden`, by the shape of its name and of its value: `<NAME>_SERVICE_HOST`
/// (an IP), `<NAME>_SERVICE_PORT[_<PORT NAME>]` (a port), `<NAME>_PORT` and
/// `<NAME>_PORT_<N>_<PROTO>` (`tcp://<ip>:<port>`), and the latter's `_PROTO`, `_PORT` and
/// `_ADDR`, with `<NAME>` the rest of the Service's name (`loopwarden-metrics`:
/// `LOOPWARDEN_METRICS_SERVICE_HOST`). Single underscores only, so they would be taken for
/// top-level keys, none of which ends so; the value must have its shape too, so that a key
/// mistyped with one underscore (`LOOPWARDEN_TELEMETRY_HTTP_PORT=9464`) stays an error.
static SERVICE_LINKS: LazyLock<Vec<(Regex, ValueShape)>> = LazyLock::new(|| {
    let ip = |v: &str| v.parse::<std::net::IpAddr>().is_ok();
    let port = |v: &str| v.parse::<u16>().is_ok();
    let proto = |v: &str| matches!(v, "tcp" | "udp" | "sctp");
    let url = |v: &str| {
        v.split_once("://").is_some_and(|(scheme, at)| {
            matches!(scheme, "tcp" | "udp" | "sctp")
                && at
                    .rsplit_once(':')
                    .is_some_and(|(host, p)| !host.is_empty() && p.parse::<u16>().is_ok())
        })
    };
    let forms: [(&str, ValueShape); 7] = [
        ("SERVICE_HOST", ip),
        ("SERVICE_PORT(?:_[A-Z0-9_]+)?", port),
        ("PORT", url),
        ("PORT_[0-9]+_(?:TCP|UDP|SCTP)", url),
        ("PORT_[0-9]+_(?:TCP|UDP|SCTP)_PROTO", proto),
        ("PORT_[0-9]+_(?:TCP|UDP|SCTP)_PORT", port),
        ("PORT_[0-9]+_(?:TCP|UDP|SCTP)_ADDR", ip),
    ];
    forms
        .into_iter()
        .map(|(name, value)| {
            let pattern = format!("^(?:[A-Z0-9_]*_)?{name}$");
            (Regex::new(&pattern).expect("a valid pattern"), value)
        })
        .collect()
});

/// Whether `rest=value` (a variable's name after `LOOPWARDEN_`) is a service link, not a key.
fn is_service_link(rest: &str, value: &str) -> bool {
    !rest.contains("__")
        && SERVICE_LINKS
            .iter()
            .any(|(name, shape)| name.is_match(rest) && shape(value))
}

/// Applies `LOOPWARDEN_A__B=value` as `a.b = value` on `table`; returns which variable
/// set which key (`a.b`), so that an error about a key can name the variable.
pub(super) fn apply_env(
    table: &mut toml::Table,
    env: impl Iterator<Item = (String, String)>,
    errors: &mut Errors,
) -> Vec<(String, String)> {
    let mut set_by = Vec::new();
    for (name, raw) in env {
        let Some(rest) = name.strip_prefix(ENV_PREFIX) else {
            continue;
        };
        if RESERVED_ENV.contains(&name.as_str())
            || name.starts_with(RESERVED_ENV_PREFIX)
            || rest.is_empty()
            || is_service_link(rest, &raw)
        {
            continue;
        }
        let path: Vec<String> = rest.split("__").map(|s| s.to_ascii_lowercase()).collect();
        if path.iter().any(|p| p.is_empty()) {
            errors.push(name.clone(), "empty key segment in environment override");
            continue;
        }
        // A value that parses as TOML (number, bool, array) keeps its type; else a string.
        // librdkafka properties are strings, taken as given: a password such as `1e5` or
        // `"x"` must reach the client unchanged.
        let librdkafka_property = path.len() > 2
            && path[0] == "kafka"
            && matches!(path[1].as_str(), "client" | "consumer" | "producer");
        let value = if librdkafka_property {
            toml::Value::String(raw.clone())
        } else {
            toml::from_str::<toml::Table>(&format!("v = {raw}"))
                .ok()
                .and_then(|mut t| t.remove("v"))
                .unwrap_or_else(|| toml::Value::String(raw.clone()))
        };
        if let Err(seg) = set_path(table, &path, value) {
            errors.push(name.clone(), format!("`{seg}` is not a table"));
            continue;
        }
        set_by.push((path.join("."), name));
    }
    set_by
}

/// Sets `path` in `table`, creating tables on the way; fails on a non-table segment.
fn set_path(table: &mut toml::Table, path: &[String], value: toml::Value) -> Result<(), String> {
    let (last, parents) = path.split_last().expect("path is never empty");
    let mut cursor = table;
    for seg in parents {
        let entry = cursor
            .entry(seg.clone())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        cursor = match entry {
            toml::Value::Table(t) => t,
            _ => return Err(seg.clone()),
        };
    }
    cursor.insert(last.clone(), value);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::is_service_link;

    #[test]
    fn service_links_are_told_from_keys() {
        for (link, value) in [
            ("SERVICE_HOST", "10.96.0.10"),
            ("SERVICE_PORT", "9464"),
            ("PORT", "tcp://10.96.0.10:9464"),
            ("PORT_9464_TCP", "tcp://10.96.0.10:9464"),
            ("PORT_9464_TCP_ADDR", "10.96.0.10"),
            ("METRICS_SERVICE_HOST", "fd00::10"),
            ("METRICS_SERVICE_PORT", "9464"),
            ("METRICS_SERVICE_PORT_HTTP_METRICS", "9464"),
            ("METRICS_PORT", "tcp://[fd00::10]:9464"),
            ("METRICS_PORT_9464_TCP", "tcp://10.96.0.10:9464"),
            ("METRICS_PORT_9464_TCP_PROTO", "tcp"),
            ("METRICS_PORT_9464_TCP_PORT", "9464"),
            ("METRICS_PORT_9464_UDP_ADDR", "10.96.0.10"),
            ("OTHER_RELEASE_PORT_53_SCTP", "sctp://10.96.0.11:53"),
        ] {
            assert!(is_service_link(link, value), "{link}={value}");
        }
        for (key, value) in [
            ("MODE", "shadow"),
            ("KAFKA__BROKERS", "10.0.0.1:9092"),
            ("KAFKA__CLIENT__SERVICE_PORT", "9092"),
            ("PORTS", "tcp://10.96.0.10:9464"),
            ("PORT_X_TCP", "tcp://10.96.0.10:9464"),
            ("PORT_9464_HTTP", "tcp://10.96.0.10:9464"),
            ("METRICS_PORT_9464_TCP_HOST", "10.96.0.10"),
            ("service_host", "10.96.0.10"),
            // A key mistyped with single underscores: the value is not a link's.
            ("TELEMETRY_HTTP_PORT", "9464"),
            ("TELEMETRY_SERVICE_HOST", "collector"),
            ("INGEST_SERVICE_PORT", "http"),
            ("METRICS_PORT_9464_TCP_PROTO", "http"),
            ("METRICS_PORT", "tcp://:9464"),
        ] {
            assert!(!is_service_link(key, value), "{key}={value}");
        }
    }
}
