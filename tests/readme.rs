//! The README is what a platform engineer configures and integrates from, so it is held
//! to the code: its configuration reference names every key of `loopwarden.toml` with
//! its environment variable and default, its detector table has every detector with its
//! defaults, and its example input events are accepted by the parser.

use std::path::Path;

use loopwarden::config::Config;
use loopwarden::contract::event::parse_event;
use loopwarden::engine::detectors::DetectorKind;

fn read(file: &str) -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(file)).unwrap()
}

/// The README section starting at `heading`, up to the next `## ` heading.
fn section<'a>(readme: &'a str, heading: &str) -> &'a str {
    let start = readme
        .find(heading)
        .unwrap_or_else(|| panic!("README has no {heading}"));
    let rest = &readme[start + heading.len()..];
    &rest[..rest.find("\n## ").unwrap_or(rest.len())]
}

/// `section.key` paths of `table` (tables of librdkafka properties and per-tool lists
/// collapse to `<property>` / `<tool>`; detectors are checked separately).
fn keys(prefix: &str, table: &toml::Table, out: &mut Vec<(String, toml::Value)>) {
    for (k, v) in table {
        let path = if prefix.is_empty() {
            k.clone()
        } else {
            format!("{prefix}.{k}")
        };
        match (path.as_str(), v) {
            ("detectors" | "overrides", _) => {}
            ("kafka.client" | "kafka.consumer" | "kafka.producer", _) => {
                out.push((format!("{path}.<property>"), v.clone()))
            }
            ("tools.ignore_args", _) => out.push((format!("{path}.<tool>"), v.clone())),
            (_, toml::Value::Table(t)) => keys(&path, t, out),
            _ => out.push((path, v.clone())),
        }
    }
}

fn env_var(key: &str) -> String {
    let parts: Vec<String> = key
        .split('.')
        .map(|p| {
            if p.starts_with('<') {
                "<NAME>".to_string()
            } else {
                p.to_ascii_uppercase()
            }
        })
        .collect();
    format!("LOOPWARDEN_{}", parts.join("__"))
}

#[test]
fn the_configuration_reference_lists_every_key_with_its_env_var_and_default() {
    let readme = read("README.md");
    let reference = section(&readme, "## Configuration reference");
    let file: toml::Table = toml::from_str(&read("loopwarden.toml")).unwrap();
    let mut all = Vec::new();
    keys("", &file, &mut all);
    assert!(all.len() > 40, "{} keys", all.len());
    for (key, default) in &all {
        let row = reference
            .lines()
            .find(|l| l.starts_with(&format!("| `{key}` |")))
            .unwrap_or_else(|| panic!("no row for `{key}` in the configuration reference"));
        assert!(
            row.contains(&format!("`{}`", env_var(key))),
            "the row of `{key}` does not name {}: {row}",
            env_var(key)
        );
        // Scalars are shown exactly as in the file; long lists are abbreviated.
        if !matches!(default, toml::Value::Array(_) | toml::Value::Table(_)) {
            assert!(
                row.contains(&format!("`{default}`")),
                "the row of `{key}` does not show its default {default}: {row}"
            );
        }
    }
    // And no row for a key that does not exist (key rows are the ones naming a variable).
    let known: Vec<&str> = all.iter().map(|(k, _)| k.as_str()).collect();
    for row in reference
        .lines()
        .filter(|l| l.starts_with("| `") && l.contains("`LOOPWARDEN_"))
    {
        let key = row.split('`').nth(1).unwrap();
        assert!(
            known.contains(&key),
            "README documents an unknown key `{key}`"
        );
    }
}

#[test]
fn the_detector_table_has_every_detector_with_its_defaults() {
    let readme = read("README.md");
    let reference = section(&readme, "## Configuration reference");
    let defaults = Config::from_toml_str("", "defaults", std::iter::empty()).unwrap();
    let effective: toml::Table = toml::from_str(&defaults.effective_toml()).unwrap();
    let detectors = effective["detectors"].as_table().unwrap();
    assert!(detectors.len() >= 24);
    let show = |v: &toml::Value| match v {
        toml::Value::String(s) => s.clone(),
        toml::Value::Float(f) if f.fract() == 0.0 => format!("{}", *f as i64),
        other => other.to_string(),
    };
    for (name, params) in detectors {
        let row = reference
            .lines()
            .find(|l| l.starts_with(&format!("| `{name}` |")))
            .unwrap_or_else(|| panic!("README.md: the detector table has no row for `{name}`"));
        let cells: Vec<&str> = row.split(" | ").map(str::trim).collect();
        let params = params.as_table().unwrap();
        for (i, level) in ["warn_at", "critical_at", "terminate_at"]
            .iter()
            .enumerate()
        {
            assert_eq!(
                cells[i + 1],
                show(&params[*level]),
                "detector `{name}` {level} in the README"
            );
        }
        for (param, value) in params {
            if [
                "warn_at",
                "critical_at",
                "terminate_at",
                "mode",
                "grace_steps",
            ]
            .contains(&param.as_str())
            {
                continue;
            }
            assert!(
                cells[4].contains(&format!("`{param}` = {}", show(value))),
                "detector `{name}`: extra key {param} = {} missing from {row}",
                show(value)
            );
        }
    }
    // ...and no row for a detector that does not exist.
    let header = "| detector | `warn_at` |";
    let table = &reference[reference
        .find(header)
        .expect("README has no detector table")..];
    for row in table.lines().skip(2).take_while(|l| l.starts_with("| `")) {
        let name = row.split('`').nth(1).unwrap();
        assert!(
            DetectorKind::from_name(name).is_some(),
            "README.md: the detector table has a row for `{name}`, which is not a detector"
        );
    }
}

#[test]
fn the_reference_config_documents_every_detector_setting_with_its_default() {
    let file: toml::Table = toml::from_str(&read("loopwarden.toml")).unwrap();
    let documented = file["detectors"]
        .as_table()
        .expect("loopwarden.toml has no [detectors]");
    let defaults = Config::from_toml_str("", "defaults", std::iter::empty()).unwrap();
    let effective: toml::Table = toml::from_str(&defaults.effective_toml()).unwrap();
    for kind in DetectorKind::ALL {
        let name = kind.name();
        let doc = documented
            .get(name)
            .and_then(|t| t.as_table())
            .unwrap_or_else(|| panic!("loopwarden.toml has no [detectors.{name}]"));
        let in_force = effective["detectors"][name].as_table().unwrap();
        for (key, value) in in_force {
            if key == "mode" || key == "grace_steps" {
                continue; // common to every detector, documented once
            }
            assert_eq!(
                doc.get(key),
                Some(value),
                "loopwarden.toml [detectors.{name}] {key}: documented {:?}, in force {value}",
                doc.get(key)
            );
        }
        for key in doc.keys() {
            assert!(
                in_force.contains_key(key),
                "loopwarden.toml [detectors.{name}] documents `{key}`, which {name} does not take"
            );
        }
    }
    for name in documented.keys() {
        assert!(
            DetectorKind::from_name(name).is_some(),
            "loopwarden.toml documents [detectors.{name}], which is not a detector"
        );
    }
}

#[test]
fn the_example_input_events_are_valid() {
    let readme = read("README.md");
    let contract = section(&readme, "### The event contract");
    let config = Config::from_toml_str("", "defaults", std::iter::empty()).unwrap();
    let mut types = Vec::new();
    for block in contract.split("```json").skip(1) {
        let block = &block[..block.find("```").unwrap()];
        // One object per example; an object may span lines.
        let stream = serde_json::Deserializer::from_str(block).into_iter::<serde_json::Value>();
        for value in stream {
            let value = value.unwrap();
            let bytes = serde_json::to_vec(&value).unwrap();
            if let Err(e) = parse_event(&bytes, &config.limits) {
                panic!("README example {value} is rejected: {e:?}");
            }
            types.push(value["type"].as_str().unwrap().to_string());
        }
    }
    types.sort();
    assert_eq!(
        types,
        [
            "cost.attributed",
            "session.completed",
            "session.started",
            "tool.called"
        ]
    );
}
