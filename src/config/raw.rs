//! Reading raw TOML: a section decoded into its `Raw…` type (unknown keys refused), every
//! refused key reported, not only the first; whole floats taken as integers.

use serde::de::DeserializeOwned;

use super::Errors;

/// The section `name` of `table` decoded, or its default when absent or refused (each
/// refusal reported).
pub(super) fn section<T: DeserializeOwned + Default>(
    table: &toml::Table,
    name: &str,
    errors: &mut Errors,
) -> T {
    match table.get(name) {
        None => T::default(),
        Some(v) => decode(v.clone(), name, errors).unwrap_or_default(),
    }
}

/// Decodes `value` (the config's `key`), reporting every key of it serde refuses, not only
/// the first: each refused key is taken out and the rest decoded again. Any refused key
/// makes the whole value `None`, so that no check runs on defaults standing in for it.
pub(super) fn decode<T: DeserializeOwned>(
    mut value: toml::Value,
    key: &str,
    errors: &mut Errors,
) -> Option<T> {
    let mut refused = false;
    // Bounded: each round takes a key out (and a value has few).
    for _ in 0..256 {
        let e = match serde_path_to_error::deserialize::<_, T>(value.clone()) {
            Ok(v) => return (!refused).then_some(v),
            Err(e) => e,
        };
        refused = true;
        let path = e.path().to_string();
        let full = if path == "." || path.is_empty() {
            key.to_string()
        } else {
            format!("{key}.{path}")
        };
        errors.push(full, e.inner().message().to_string());
        let mut segments: Vec<&serde_path_to_error::Segment> = e.path().iter().collect();
        // An array loses the whole of it: taking one item out would shift the indices
        // of the others, and a later error would name the wrong one.
        while matches!(
            segments.last(),
            Some(serde_path_to_error::Segment::Seq { .. })
        ) {
            segments.pop();
        }
        if !remove_at(&mut value, &segments) {
            break;
        }
    }
    None
}

/// Takes the table entry at `path` out of `value`; false when there is none (`decode`
/// never takes out an array's item).
fn remove_at(value: &mut toml::Value, path: &[&serde_path_to_error::Segment]) -> bool {
    use serde_path_to_error::Segment;
    let Some((Segment::Map { key: last }, parents)) = path.split_last() else {
        return false;
    };
    let mut cursor = value;
    for seg in parents {
        let next = match (seg, cursor) {
            (Segment::Map { key }, toml::Value::Table(t)) => t.get_mut(key.as_str()),
            (Segment::Seq { index }, toml::Value::Array(a)) => a.get_mut(*index),
            _ => None,
        };
        match next {
            Some(v) => cursor = v,
            None => return false,
        }
    }
    match cursor {
        toml::Value::Table(t) => t.remove(last.as_str()).is_some(),
        _ => false,
    }
}

/// Turns floats without a fraction (`20000.0`) into integers, at any depth. TOML written
/// by tools often has them — Helm's `toToml` writes every YAML number as a float — and an
/// integer key (batch sizes, ports, librdkafka properties) would reject them; a float key
/// accepts an integer as well, so nothing else changes.
pub(super) fn whole_floats_to_integers(table: &mut toml::Table) {
    fn visit(value: &mut toml::Value) {
        match value {
            toml::Value::Float(f) if f.fract() == 0.0 && f.abs() < 9.0e15 => {
                *value = toml::Value::Integer(*f as i64);
            }
            toml::Value::Table(t) => t.iter_mut().for_each(|(_, v)| visit(v)),
            toml::Value::Array(items) => items.iter_mut().for_each(visit),
            _ => {}
        }
    }
    table.iter_mut().for_each(|(_, v)| visit(v));
}
