//! The field names of a serde-derived struct, read from its `Deserialize` implementation.
//!
//! The JSON forms of the compression config are derived structs; their field names are needed
//! beside the derive (a request naming a STAR-KV field gets an error naming that field, and a
//! field error carries a `&'static str`). Asking the derive keeps one list, the struct itself.

use serde::de::{self, Deserialize, Deserializer, Visitor};

/// The fields `T` declares, in declaration order (empty for anything but a struct).
pub(crate) fn struct_fields<T: for<'de> Deserialize<'de>>() -> &'static [&'static str] {
    let mut fields: &'static [&'static str] = &[];
    // The deserializer only records what the derive asks for, then stops it with an error.
    let _ = T::deserialize(FieldNames(&mut fields));
    fields
}

/// A deserializer that answers nothing: it records the field list a struct asks for.
struct FieldNames<'a>(&'a mut &'static [&'static str]);

impl<'de> Deserializer<'de> for FieldNames<'_> {
    type Error = de::value::Error;

    fn deserialize_any<V: Visitor<'de>>(self, _visitor: V) -> Result<V::Value, Self::Error> {
        Err(de::Error::custom("only struct field names are read"))
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        fields: &'static [&'static str],
        _visitor: V,
    ) -> Result<V::Value, Self::Error> {
        *self.0 = fields;
        Err(de::Error::custom("only struct field names are read"))
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
        option unit unit_struct newtype_struct seq tuple tuple_struct map enum identifier
        ignored_any
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(serde::Deserialize)]
    #[allow(dead_code)]
    struct Two {
        a: u32,
        b: Option<String>,
    }

    #[test]
    fn reads_the_declared_fields() {
        assert_eq!(struct_fields::<Two>(), ["a", "b"]);
        assert!(struct_fields::<u32>().is_empty());
    }
}
