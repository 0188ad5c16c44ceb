//! Decoding a method's `params`, one named field at a time.
//!
//! Methods ask for each field they know by name and type; [`Params::finish`] then rejects
//! whatever is left, naming it and listing the fields the method accepts. Every error names its
//! field, which a serde derive cannot do for type mismatches, and which the configuration loader
//! relies on to point at `bdev[1].block_size` rather than at a whole table.

use serde_json::{Map, Value};

use crate::RpcError;

/// A parameter that is missing, of the wrong type, out of range or unknown.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", self.render())]
pub struct ParamError {
    /// The parameter's name; empty when the problem is the `params` value as a whole.
    pub field: String,
    /// What is wrong and what would be accepted.
    pub reason: String,
}

impl ParamError {
    pub fn new(field: impl Into<String>, reason: impl Into<String>) -> ParamError {
        ParamError { field: field.into(), reason: reason.into() }
    }

    fn render(&self) -> String {
        if self.field.is_empty() {
            self.reason.clone()
        } else {
            format!("{}: {}", self.field, self.reason)
        }
    }
}

impl From<ParamError> for RpcError {
    fn from(e: ParamError) -> RpcError {
        RpcError::invalid_params(e.to_string())
    }
}

/// The value under which an SPDK-only parameter is accepted (see [`Params::unsupported`]).
#[derive(Debug, Clone, Copy)]
pub enum Neutral {
    /// Only when left out.
    Absent,
    Int(i64),
    Bool(bool),
    Str(&'static str),
}

/// A method's parameters being decoded. See the module docs.
#[derive(Debug)]
pub struct Params {
    map: Map<String, Value>,
    accepted: Vec<&'static str>,
}

/// Describes a JSON value for an error message ("string \"x\"", "number -1", "an array").
fn describe(v: &Value) -> String {
    match v {
        Value::Null => "null".into(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => format!("number {n}"),
        Value::String(s) if s.chars().count() > 64 => {
            format!("string \"{}...\"", s.chars().take(64).collect::<String>())
        }
        Value::String(s) => format!("string \"{s}\""),
        Value::Array(_) => "an array".into(),
        Value::Object(_) => "an object".into(),
    }
}

impl Params {
    /// Takes a request's `params`. Absent (or null) params decode as an empty object, so a
    /// method with required fields reports the first missing one by name. Positional (array)
    /// params are refused: every flashpath method takes named parameters, as SPDK's do.
    pub fn new(params: Option<Value>) -> Result<Params, ParamError> {
        let map = match params {
            None | Some(Value::Null) => Map::new(),
            Some(Value::Object(map)) => map,
            Some(other) => {
                return Err(ParamError::new(
                    "",
                    format!("params must be an object of named parameters, not {}", describe(&other)),
                ))
            }
        };
        Ok(Params { map, accepted: Vec::new() })
    }

    /// Removes a field, remembering that the method accepts it. Null counts as absent, so
    /// clients that send `"name": null` for "not given" work.
    fn take(&mut self, field: &'static str) -> Option<Value> {
        self.accepted.push(field);
        self.map.remove(field).filter(|v| !v.is_null())
    }

    fn missing(field: &'static str, what: &str) -> ParamError {
        ParamError::new(field, format!("required parameter missing ({what})"))
    }

    pub fn optional_str(&mut self, field: &'static str) -> Result<Option<String>, ParamError> {
        match self.take(field) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(v) => Err(ParamError::new(field, format!("expected a string, got {}", describe(&v)))),
        }
    }

    pub fn required_str(&mut self, field: &'static str) -> Result<String, ParamError> {
        self.optional_str(field)?.ok_or_else(|| Self::missing(field, "a string"))
    }

    pub fn optional_bool(&mut self, field: &'static str) -> Result<Option<bool>, ParamError> {
        match self.take(field) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(b)),
            Some(v) => Err(ParamError::new(field, format!("expected true or false, got {}", describe(&v)))),
        }
    }

    /// A list of strings (SPDK's `names`).
    pub fn optional_str_list(&mut self, field: &'static str) -> Result<Option<Vec<String>>, ParamError> {
        let items = match self.take(field) {
            None => return Ok(None),
            Some(Value::Array(items)) => items,
            Some(v) => {
                return Err(ParamError::new(
                    field,
                    format!("expected a list of strings, got {}", describe(&v)),
                ))
            }
        };
        items
            .into_iter()
            .enumerate()
            .map(|(i, v)| match v {
                Value::String(s) => Ok(s),
                other => Err(ParamError::new(
                    format!("{field}[{i}]"),
                    format!("expected a string, got {}", describe(&other)),
                )),
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Some)
    }

    /// A list whose items the method decodes itself (items of more than one shape).
    pub fn optional_list(&mut self, field: &'static str) -> Result<Option<Vec<Value>>, ParamError> {
        match self.take(field) {
            None => Ok(None),
            Some(Value::Array(items)) => Ok(Some(items)),
            Some(v) => Err(ParamError::new(field, format!("expected a list, got {}", describe(&v)))),
        }
    }

    /// An object, left for the method to decode (SPDK's nested `listen_address`, `namespace`).
    /// A list of names given either as a list of strings or as one string of names separated
    /// by whitespace (SPDK's `base_bdevs` is sent both ways by its clients over the years).
    pub fn optional_names(&mut self, field: &'static str) -> Result<Option<Vec<String>>, ParamError> {
        match self.map.get(field) {
            Some(Value::String(s)) => {
                let names = s.split_whitespace().map(str::to_string).collect();
                self.take(field);
                Ok(Some(names))
            }
            _ => self.optional_str_list(field),
        }
    }

    pub fn optional_object(&mut self, field: &'static str) -> Result<Option<Map<String, Value>>, ParamError> {
        match self.take(field) {
            None => Ok(None),
            Some(Value::Object(map)) => Ok(Some(map)),
            Some(v) => Err(ParamError::new(field, format!("expected an object, got {}", describe(&v)))),
        }
    }

    /// A map of option names to text values (Ceph's `config_param`): an object whose values
    /// are strings, numbers or booleans (a configuration file writes `timeout = 3`), in key
    /// order. An error names the offending key as `field.key`.
    pub fn optional_str_map(
        &mut self,
        field: &'static str,
    ) -> Result<Option<Vec<(String, String)>>, ParamError> {
        let map = match self.take(field) {
            None => return Ok(None),
            Some(Value::Object(map)) => map,
            Some(v) => {
                return Err(ParamError::new(
                    field,
                    format!("expected an object of option names to values, got {}", describe(&v)),
                ))
            }
        };
        map.into_iter()
            .map(|(k, v)| match v {
                Value::String(s) => Ok((k, s)),
                Value::Number(n) => Ok((k, n.to_string())),
                Value::Bool(b) => Ok((k, b.to_string())),
                other => Err(ParamError::new(
                    format!("{field}.{k}"),
                    format!("expected a string, number or boolean, got {}", describe(&other)),
                )),
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Some)
    }

    /// An unsigned integer no larger than `max`.
    pub fn optional_uint(&mut self, field: &'static str, max: u64) -> Result<Option<u64>, ParamError> {
        match self.take(field) {
            None => Ok(None),
            Some(Value::Number(n)) if n.as_u64().is_some_and(|x| x <= max) => Ok(n.as_u64()),
            Some(v) => Err(ParamError::new(
                field,
                format!("expected an integer between 0 and {max}, got {}", describe(&v)),
            )),
        }
    }

    /// A signed integer from `min` to `max` (SPDK's `-1` for "forever").
    pub fn optional_int(
        &mut self,
        field: &'static str,
        min: i64,
        max: i64,
    ) -> Result<Option<i64>, ParamError> {
        match self.take(field) {
            None => Ok(None),
            Some(Value::Number(n)) if n.as_i64().is_some_and(|x| (min..=max).contains(&x)) => Ok(n.as_i64()),
            Some(v) => Err(ParamError::new(
                field,
                format!("expected an integer between {min} and {max}, got {}", describe(&v)),
            )),
        }
    }

    pub fn required_uint(&mut self, field: &'static str, max: u64) -> Result<u64, ParamError> {
        self.optional_uint(field, max)?
            .ok_or_else(|| Self::missing(field, &format!("an integer between 0 and {max}")))
    }

    /// A parameter SPDK defines for this method but flashpath does not implement. SPDK's
    /// `rpc.py` sends some of them with their default value on every call (`"md_size": 0`,
    /// `"packed_ring": false`), so they are accepted when absent, null or equal to `neutral`,
    /// and refused by name otherwise. They are not listed as accepted parameters.
    pub fn unsupported(&mut self, field: &'static str, neutral: Option<Value>) -> Result<(), ParamError> {
        match (self.map.remove(field), neutral) {
            (None | Some(Value::Null), _) => Ok(()),
            (Some(v), Some(n)) if v == n => Ok(()),
            (Some(_), Some(n)) => {
                Err(ParamError::new(field, format!("not supported by flashpath (only {n})")))
            }
            (Some(_), None) => Err(ParamError::new(field, "not supported by flashpath")),
        }
    }

    /// [`Params::unsupported`] for each of `fields`: a method's list of SPDK-only parameters.
    pub fn spdk_only(&mut self, fields: &[(&'static str, Neutral)]) -> Result<(), ParamError> {
        for &(field, neutral) in fields {
            let neutral = match neutral {
                Neutral::Absent => None,
                Neutral::Int(i) => Some(Value::from(i)),
                Neutral::Bool(b) => Some(Value::from(b)),
                Neutral::Str(s) => Some(Value::from(s)),
            };
            self.unsupported(field, neutral)?;
        }
        Ok(())
    }

    /// Fails on the first field no `take` asked for.
    pub fn finish(self) -> Result<(), ParamError> {
        match self.map.keys().next() {
            None => Ok(()),
            Some(extra) => {
                let reason = if self.accepted.is_empty() {
                    "unknown parameter; this method takes no parameters".to_string()
                } else {
                    format!("unknown parameter; accepted: {}", self.accepted.join(", "))
                };
                Err(ParamError::new(extra.clone(), reason))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn decodes_fields_and_rejects_leftovers() {
        let mut p = Params::new(Some(json!({"name": "n0", "num_blocks": 8, "ro": true, "x": 1}))).unwrap();
        assert_eq!(p.required_str("name").unwrap(), "n0");
        assert_eq!(p.required_uint("num_blocks", u64::MAX).unwrap(), 8);
        assert_eq!(p.optional_bool("ro").unwrap(), Some(true));
        assert_eq!(p.optional_str("absent").unwrap(), None);
        let e = p.finish().unwrap_err();
        assert_eq!(e.field, "x");
        assert_eq!(e.to_string(), "x: unknown parameter; accepted: name, num_blocks, ro, absent");
    }

    #[test]
    fn objects_are_left_for_the_method() {
        let mut p = Params::new(Some(json!({"namespace": {"bdev_name": "m0"}, "bad": [1]}))).unwrap();
        let ns = p.optional_object("namespace").unwrap().unwrap();
        assert_eq!(ns.get("bdev_name"), Some(&json!("m0")));
        assert_eq!(p.optional_object("absent").unwrap(), None);
        assert_eq!(
            p.optional_object("bad").unwrap_err().to_string(),
            "bad: expected an object, got an array"
        );
    }

    #[test]
    fn names_the_field_on_type_and_range_errors() {
        let mut p = Params::new(Some(json!({"block_size": "512"}))).unwrap();
        let e = p.required_uint("block_size", u32::MAX as u64).unwrap_err();
        assert_eq!(
            e.to_string(),
            "block_size: expected an integer between 0 and 4294967295, got string \"512\""
        );

        let mut p = Params::new(Some(json!({"q": 70000}))).unwrap();
        assert_eq!(p.optional_uint("q", 65535).unwrap_err().field, "q");

        let mut p = Params::new(Some(json!({"q": -1}))).unwrap();
        assert!(p.optional_uint("q", 65535).unwrap_err().reason.contains("number -1"));

        let mut p = Params::new(Some(json!({"ro": 1}))).unwrap();
        assert_eq!(
            p.optional_bool("ro").unwrap_err().to_string(),
            "ro: expected true or false, got number 1"
        );
    }

    #[test]
    fn signed_integers_are_bounded_both_ways() {
        let mut p = Params::new(Some(json!({"a": -1, "b": -2, "c": 1.5}))).unwrap();
        assert_eq!(p.optional_int("a", -1, 10).unwrap(), Some(-1));
        assert_eq!(
            p.optional_int("b", -1, 10).unwrap_err().to_string(),
            "b: expected an integer between -1 and 10, got number -2"
        );
        assert_eq!(p.optional_int("c", -1, 10).unwrap_err().field, "c");
        assert_eq!(p.optional_int("absent", -1, 10).unwrap(), None);
    }

    #[test]
    fn missing_and_null_and_absent_params() {
        let mut p = Params::new(None).unwrap();
        let e = p.required_str("name").unwrap_err();
        assert_eq!(e.to_string(), "name: required parameter missing (a string)");

        let mut p = Params::new(Some(json!({"name": null}))).unwrap();
        assert_eq!(p.optional_str("name").unwrap(), None);
        p.finish().unwrap();

        let e = Params::new(Some(json!([1, 2]))).unwrap_err();
        assert_eq!(e.field, "");
        assert!(e.to_string().starts_with("params must be an object"));

        let p = Params::new(Some(json!({"a": 1}))).unwrap();
        assert!(p.finish().unwrap_err().reason.contains("takes no parameters"));
    }

    #[test]
    fn unsupported_fields_pass_only_when_neutral() {
        let mut p =
            Params::new(Some(json!({"md_size": 0, "packed_ring": false, "uuid": null, "n": 1}))).unwrap();
        p.unsupported("md_size", Some(json!(0))).unwrap();
        p.unsupported("packed_ring", Some(json!(false))).unwrap();
        p.unsupported("uuid", None).unwrap();
        p.unsupported("absent", Some(json!(0))).unwrap();
        assert_eq!(p.optional_uint("n", 9).unwrap(), Some(1));
        p.finish().unwrap();

        let mut p = Params::new(Some(json!({"md_size": 8, "uuid": "x"}))).unwrap();
        assert_eq!(
            p.unsupported("md_size", Some(json!(0))).unwrap_err().to_string(),
            "md_size: not supported by flashpath (only 0)"
        );
        assert_eq!(p.unsupported("uuid", None).unwrap_err().to_string(), "uuid: not supported by flashpath");
    }

    #[test]
    fn converts_to_invalid_params() {
        let e: RpcError = ParamError::new("name", "bad").into();
        assert_eq!(e.code, crate::codes::INVALID_PARAMS);
        assert_eq!(e.message, "name: bad");
    }
}
