//! `LOOPWARDEN_…` environment variables as configuration overrides: `LOOPWARDEN_A__B=v`
//! sets `a.b = v`, typed as TOML where it parses (librdkafka properties: always strings).

use std::sync::LazyLock;

use regex::Regex;

use super::{Errors, ENV_PREFIX, RESERVED_ENV, RESERVED_ENV_PREFIX};

/// What the kubelet (service links, on by default) and Docker's legacy links set for a
/// service or container whose name starts with `loopwarden`: `<NAME>_SERVICE_HOST`,
/// `<NAME>_SERVICE_PORT[_<PORT NAME>]`, `<NAME>_PORT[_<N>_<PROTO>[_PROTO|_PORT|_ADDR]]`,
/// with `<NAME>` the rest of the service's name (`loopwarden-metrics`:
/// `LOOPWARDEN_METRICS_SERVICE_HOST`). Single underscores only, so they would be taken
/// for top-level keys, none of which ends so.
static SERVICE_LINK: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        "^(?:[A-Z0-9_]*_)?(?:SERVICE_HOST|SERVICE_PORT(?:_[A-Z0-9_]+)?|PORT(?:_[0-9]+_(?:TCP|UDP|SCTP)(?:_(?:PROTO|PORT|ADDR))?)?)$",
    )
    .expect("a valid pattern")
});

/// Whether `rest` (a variable's name after `LOOPWARDEN_`) is a service link, not a key.
fn is_service_link(rest: &str) -> bool {
    !rest.contains("__") && SERVICE_LINK.is_match(rest)
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
            || is_service_link(rest)
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
        for link in [
            "SERVICE_HOST",
            "SERVICE_PORT",
            "PORT",
            "PORT_9464_TCP",
            "PORT_9464_TCP_ADDR",
            "METRICS_SERVICE_HOST",
            "METRICS_SERVICE_PORT",
            "METRICS_SERVICE_PORT_HTTP_METRICS",
            "METRICS_PORT",
            "METRICS_PORT_9464_TCP",
            "METRICS_PORT_9464_TCP_PROTO",
            "METRICS_PORT_9464_TCP_PORT",
            "METRICS_PORT_9464_UDP_ADDR",
            "OTHER_RELEASE_PORT_53_SCTP",
        ] {
            assert!(is_service_link(link), "{link}");
        }
        for key in [
            "MODE",
            "KAFKA__BROKERS",
            "KAFKA__CLIENT__SERVICE_PORT",
            "TELEMETRY__HTTP_PORT",
            "PORTS",
            "PORT_X_TCP",
            "PORT_9464_HTTP",
            "METRICS_PORT_9464_TCP_HOST",
            "service_host",
        ] {
            assert!(!is_service_link(key), "{key}");
        }
    }
}
