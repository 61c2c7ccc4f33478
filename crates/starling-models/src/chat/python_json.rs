//! `tojson` as transformers defines it for chat templates:
//! `json.dumps(value, ensure_ascii=False, indent=indent, separators=separators,
//! sort_keys=sort_keys)`. minijinja's own `tojson` escapes `<`, `>`, `&` and `'` for HTML and
//! writes compact separators, which would change tool-calling prompts.

use minijinja::value::{Kwargs, ValueKind};
use minijinja::{Error, ErrorKind, Value};

/// Formatting choices, as in Python's `json.dumps`.
struct Style {
    indent: Option<usize>,
    item_separator: String,
    key_separator: String,
    sort_keys: bool,
    ensure_ascii: bool,
}

/// The `tojson` filter.
pub(super) fn tojson(value: &Value, kwargs: Kwargs) -> Result<Value, Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    let separators: Option<Vec<String>> = kwargs.get("separators")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    let ensure_ascii: Option<bool> = kwargs.get("ensure_ascii")?;
    kwargs.assert_all_used()?;
    // Python's defaults: ", " between items without indent, "," with it (the newline follows).
    let (item_separator, key_separator) = match separators.as_deref() {
        Some([item, key]) => (item.clone(), key.clone()),
        Some(_) => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                "tojson separators must be a pair (item_separator, key_separator)",
            ))
        }
        None if indent.is_some() => (",".to_owned(), ": ".to_owned()),
        None => (", ".to_owned(), ": ".to_owned()),
    };
    let style = Style {
        indent,
        item_separator,
        key_separator,
        sort_keys: sort_keys.unwrap_or(false),
        ensure_ascii: ensure_ascii.unwrap_or(false),
    };
    let mut out = String::new();
    write_value(&mut out, value, &style, 0)?;
    Ok(Value::from_safe_string(out))
}

fn write_value(out: &mut String, value: &Value, style: &Style, depth: usize) -> Result<(), Error> {
    match value.kind() {
        ValueKind::Undefined | ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
        ValueKind::Number => write_number(out, value),
        ValueKind::String => write_string(out, value.as_str().unwrap_or_default(), style),
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = value.try_iter()?.collect();
            write_container(out, '[', ']', &items, style, depth, |out, item| {
                write_value(out, item, style, depth + 1)
            })?;
        }
        ValueKind::Map => {
            let mut keys: Vec<Value> = value.try_iter()?.collect();
            if style.sort_keys {
                keys.sort_by_key(|key| key.to_string());
            }
            write_container(out, '{', '}', &keys, style, depth, |out, key| {
                // JSON keys are strings; Python converts numbers and booleans the same way.
                write_string(out, &key.to_string(), style);
                out.push_str(&style.key_separator);
                write_value(out, &value.get_item(key)?, style, depth + 1)
            })?;
        }
        _ => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                format!("tojson cannot serialize a value of kind {}", value.kind()),
            ))
        }
    }
    Ok(())
}

/// Writes `[a, b]` / `{..}` with Python's layout for `indent` and separators.
fn write_container(
    out: &mut String,
    open: char,
    close: char,
    items: &[Value],
    style: &Style,
    depth: usize,
    mut write_item: impl FnMut(&mut String, &Value) -> Result<(), Error>,
) -> Result<(), Error> {
    out.push(open);
    if items.is_empty() {
        out.push(close);
        return Ok(());
    }
    for (index, item) in items.iter().enumerate() {
        if index > 0 {
            out.push_str(&style.item_separator);
        }
        if let Some(width) = style.indent {
            out.push('\n');
            out.push_str(&" ".repeat(width * (depth + 1)));
        }
        write_item(out, item)?;
    }
    if let Some(width) = style.indent {
        out.push('\n');
        out.push_str(&" ".repeat(width * depth));
    }
    out.push(close);
    Ok(())
}

/// Integers as integers; floats as Python's `repr` would (`1.0`, not `1`).
fn write_number(out: &mut String, value: &Value) {
    if value.is_integer() {
        out.push_str(&value.to_string());
        return;
    }
    let float = f64::try_from(value.clone()).unwrap_or(f64::NAN);
    if float.is_nan() {
        out.push_str("NaN");
    } else if float.is_infinite() {
        out.push_str(if float > 0.0 { "Infinity" } else { "-Infinity" });
    } else if float.fract() == 0.0 && float.abs() < 1e16 {
        out.push_str(&format!("{float:.1}"));
    } else {
        out.push_str(&float.to_string());
    }
}

/// A JSON string literal: `"`, `\` and control characters escaped, everything else verbatim
/// (or `\uXXXX` for non-ASCII when `ensure_ascii` is asked for).
fn write_string(out: &mut String, text: &str, style: &Style) {
    out.push('"');
    for ch in text.chars() {
        match ch {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{08}' => out.push_str("\\b"),
            '\u{0C}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 || (style.ensure_ascii && !c.is_ascii()) => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    out.push_str(&format!("\\u{unit:04x}"));
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dumps(value: Value) -> String {
        let style = Style {
            indent: None,
            item_separator: ", ".to_owned(),
            key_separator: ": ".to_owned(),
            sort_keys: false,
            ensure_ascii: false,
        };
        let mut out = String::new();
        write_value(&mut out, &value, &style, 0).unwrap();
        out
    }

    #[test]
    fn scalars_like_python() {
        assert_eq!(dumps(Value::from(())), "null");
        assert_eq!(dumps(Value::from(true)), "true");
        assert_eq!(dumps(Value::from(3)), "3");
        assert_eq!(dumps(Value::from(2.0)), "2.0");
        assert_eq!(dumps(Value::from(0.25)), "0.25");
        assert_eq!(dumps(Value::from("a\u{1}b😀")), "\"a\\u0001b😀\"");
        assert_eq!(dumps(Value::from(vec![1, 2])), "[1, 2]");
        assert_eq!(dumps(Value::from(Vec::<i32>::new())), "[]");
    }
}
