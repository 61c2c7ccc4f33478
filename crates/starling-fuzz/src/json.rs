//! Structure-aware mutations for JSON inputs: parse, change one node, print. Byte mutations
//! mostly break the syntax; these keep it and reach the code behind the parser — odd numbers,
//! wrong types, missing and repeated fields.

use serde_json::{Map, Number, Value};

use crate::rng::SplitMix64;

/// Values that sit on boundaries of what a field may hold.
fn interesting_value(rng: &mut SplitMix64, keys: &[&str]) -> Value {
    let long = "x".repeat(1 + rng.below(4096));
    match rng.below(22) {
        0 => Value::Null,
        1 => Value::Bool(rng.one_in(2)),
        2 => Value::from(0),
        3 => Value::from(-1),
        4 => Value::from(1),
        5 => Value::from(u64::MAX),
        6 => Value::from(i64::MIN),
        7 => Value::from(4_294_967_296u64),
        8 => Number::from_f64(1e308).map_or(Value::Null, Value::Number),
        9 => Number::from_f64(-1e-308).map_or(Value::Null, Value::Number),
        10 => Number::from_f64(0.5).map_or(Value::Null, Value::Number),
        11 => Value::from(""),
        12 => Value::from(long),
        13 => Value::Array(Vec::new()),
        14 => Value::Object(Map::new()),
        15 => Value::from(vec![Value::from(0); 1 + rng.below(64)]),
        16 => Value::from(65_536),
        17 => Value::from(rng.next_u64() % 1_000_000),
        18 => Value::from("\u{0}\u{ffff}\u{1f600}{{ }}{% %}"),
        19 => Value::from(-(rng.below(100) as i64)),
        20 if !keys.is_empty() => Value::from(keys[rng.below(keys.len())]),
        _ => Value::from(vec![Value::from("a"), Value::from(1)]),
    }
}

/// Counts the nodes of `value`.
fn size(value: &Value) -> usize {
    1 + match value {
        Value::Array(items) => items.iter().map(size).sum(),
        Value::Object(map) => map.values().map(size).sum(),
        _ => 0,
    }
}

/// Applies `apply` to the `index`-th node of `value` in pre-order; false when there is none.
fn edit_nth(value: &mut Value, index: &mut usize, apply: &mut dyn FnMut(&mut Value)) -> bool {
    if *index == 0 {
        apply(value);
        return true;
    }
    *index -= 1;
    match value {
        Value::Array(items) => items.iter_mut().any(|v| edit_nth(v, index, apply)),
        Value::Object(map) => map.values_mut().any(|v| edit_nth(v, index, apply)),
        _ => false,
    }
}

/// A structural mutation of `input` if it is JSON; `None` otherwise. `keys` are field names
/// worth adding (or using as string values).
pub fn mutate(input: &[u8], keys: &[&str], rng: &mut SplitMix64) -> Option<Vec<u8>> {
    let mut root: Value = serde_json::from_slice(input).ok()?;
    let edits = 1 + rng.below(4);
    for _ in 0..edits {
        let mut index = rng.below(size(&root));
        edit_nth(&mut root, &mut index, &mut |target| edit(target, keys, rng));
    }
    serde_json::to_vec(&root).ok()
}

fn edit(target: &mut Value, keys: &[&str], rng: &mut SplitMix64) {
    match (rng.below(6), &mut *target) {
        (0, Value::Object(map)) if !map.is_empty() => {
            let key = map.keys().nth(rng.below(map.len())).cloned();
            if let Some(key) = key {
                map.remove(&key);
            }
        }
        (1, Value::Object(map)) if !keys.is_empty() => {
            let key = keys[rng.below(keys.len())];
            map.insert(key.to_owned(), interesting_value(rng, keys));
        }
        (2, Value::Array(items)) if !items.is_empty() => {
            let copies = 1 + rng.below(64);
            let item = items[rng.below(items.len())].clone();
            items.extend(std::iter::repeat_n(item, copies));
        }
        (3, Value::Number(n)) => {
            let scaled = n
                .as_f64()
                .map(|v| v * [-1.0, 0.0, 1e6, 1e-6, 2.0][rng.below(5)]);
            *target = scaled
                .and_then(Number::from_f64)
                .map_or(Value::Null, Value::Number);
        }
        (4, _) => {
            // Deeper nesting of the same value.
            let inner = target.take();
            *target = Value::Array(vec![inner]);
        }
        _ => *target = interesting_value(rng, keys),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn structural_mutations_keep_json_valid_and_vary() {
        let mut rng = SplitMix64::new(9);
        let seed = br#"{"prompt": "hi", "max_tokens": 4, "stop": ["a"], "nested": {"x": [1, 2]}}"#;
        let mut distinct = std::collections::HashSet::new();
        for _ in 0..2_000 {
            let out = mutate(seed, &["temperature", "top_k"], &mut rng).expect("JSON in, JSON out");
            assert!(serde_json::from_slice::<Value>(&out).is_ok());
            distinct.insert(out);
        }
        assert!(distinct.len() > 500, "{}", distinct.len());
        assert!(mutate(b"not json", &[], &mut rng).is_none());
    }
}
