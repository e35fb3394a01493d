//! Writing into JSON that Shield builds (answers, errors), without `Value`'s `IndexMut`, which
//! panics when a step of the path is not an object: a path through a non-object is left
//! untouched. Never used on an upstream's bytes (those are parsed into typed views).

use serde_json::{Map, Value};

/// `value[path[0]][path[1]]… = field`, creating objects along the way (a `null` step becomes
/// an object, as `IndexMut` would make it); any other non-object step leaves `value` as it is.
pub fn set(value: &mut Value, path: &[&str], field: Value) {
    let Some((last, steps)) = path.split_last() else { return };
    let mut at = value;
    for step in steps {
        if at.is_null() {
            *at = Value::Object(Map::new());
        }
        let Some(object) = at.as_object_mut() else { return };
        at = object.entry(*step).or_insert(Value::Null);
    }
    if at.is_null() {
        *at = Value::Object(Map::new());
    }
    if let Some(object) = at.as_object_mut() {
        object.insert((*last).to_string(), field);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn sets_through_objects_and_leaves_anything_else() {
        let mut error = json!({"error": {"message": "x"}});
        set(&mut error, &["error", "code"], json!("c"));
        set(&mut error, &["x_shield"], json!({"routing": 1}));
        assert_eq!(error, json!({"error": {"message": "x", "code": "c"}, "x_shield": {"routing": 1}}));
        let mut null = Value::Null;
        set(&mut null, &["a", "b"], json!(1));
        assert_eq!(null, json!({"a": {"b": 1}}));
        let mut array = json!([1]);
        set(&mut array, &["a"], json!(1));
        assert_eq!(array, json!([1]), "not an object: untouched, no panic");
        let mut nested = json!({"a": "text"});
        set(&mut nested, &["a", "b"], json!(1));
        assert_eq!(nested, json!({"a": "text"}));
    }
}
