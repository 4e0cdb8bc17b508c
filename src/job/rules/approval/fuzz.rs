//! Property tests of reading and normalizing an approval, over random JSON: malformed
//! lists, mixed types, huge and boundary numbers, strings that look like numbers, keys
//! that collide in the key column's type, unicode and quote characters in field names.
//!
//! Whatever arrives, the outcome is a normal form or a `BatchError` a caller can act on,
//! never a panic. A normal form holds each key once, in the key column's own type and
//! order, and depends only on the content: listing the items in another order gives the
//! same fingerprint, and reading a registration back from its stored rows gives the same
//! fingerprint again, which is how a repeated registration is recognised.
//!
//! The case counts keep the whole module to a few seconds (PROPTEST_CASES sets another
//! count for every property); a failure prints the smallest input proptest could shrink
//! it to.

use super::*;
use crate::job::rules::columns::{parse_uuid, Kind};
use crate::job::rules::key::KeyOrder;
use proptest::collection::{btree_set, vec};
use proptest::option;
use proptest::prelude::*;
use proptest::sample::select;
use serde_json::{json, Map};
use std::collections::HashMap;

/// `cases` per property, or PROPTEST_CASES for a longer run.
fn config(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases: std::env::var("PROPTEST_CASES")
            .ok()
            .and_then(|n| n.parse().ok())
            .unwrap_or(cases),
        // A regression file would be written into the source tree.
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

// shapes ------------------------------------------------------------------------------

const KEY_TYPES: &[&str] = &["int2", "int4", "int8", "text", "varchar", "uuid"];
const REVISION_TYPES: &[&str] = &["int2", "int4", "int8"];

/// The guardable columns of every target: one of each kind, and names that a parser or
/// a quoting routine could trip on.
const GUARDS: &[(&str, &str)] = &[
    ("qty", "int4"),
    ("small", "int2"),
    ("big", "int8"),
    ("status", "text"),
    ("price", "numeric"),
    ("ratio", "float8"),
    ("flag", "bool"),
    ("ref", "uuid"),
    ("due", "date"),
    ("say \"hi\"", "text"),
    ("größe", "int4"),
    ("1", "int4"),
    ("a\\b", "text"),
];

fn shape(key_type: &str, revision_type: &str) -> Shape {
    let mut columns: Vec<(&str, &str)> = vec![
        ("id", key_type),
        ("tenant", "text"),
        ("revision", revision_type),
    ];
    columns.extend_from_slice(GUARDS);
    Shape::of_orders(&columns)
}

fn any_shape() -> impl Strategy<Value = Shape> {
    (select(KEY_TYPES), select(REVISION_TYPES)).prop_map(|(k, r)| shape(k, r))
}

fn approval(items: Vec<Item>) -> Approval {
    Approval::of_orders(items)
}

// JSON ------------------------------------------------------------------------------------

/// Boundaries of every integer type a key, revision or guard may have, one step on
/// either side, and the extremes serde_json keeps exactly.
fn boundary_integer() -> impl Strategy<Value = Value> {
    let mut bounds: Vec<Value> = Vec::new();
    for b in [
        i16::MIN as i64,
        i16::MAX as i64,
        i32::MIN as i64,
        i32::MAX as i64,
    ] {
        bounds.extend([json!(b - 1), json!(b), json!(b + 1)]);
    }
    bounds.extend([
        json!(i64::MIN),
        json!(i64::MIN + 1),
        json!(i64::MAX),
        json!(i64::MAX as u64 + 1),
        json!(u64::MAX),
        json!(0),
        json!(-1),
    ]);
    select(bounds)
}

fn number() -> impl Strategy<Value = Value> {
    prop_oneof![
        3 => (-3i64..20).prop_map(Value::from),
        2 => boundary_integer(),
        1 => any::<i64>().prop_map(Value::from),
        1 => any::<u64>().prop_map(Value::from),
        // serde_json has no NaN or infinity: from_f64 refuses them.
        1 => any::<f64>().prop_filter_map("finite", |f| serde_json::Number::from_f64(f).map(Value::Number)),
        1 => select(vec![1.0, 1.5, 1e300, -1e-300, f64::MAX, f64::MIN_POSITIVE, 3e9])
            .prop_map(|f| json!(f)),
    ]
}

/// Strings that look like numbers, booleans, uuids or JSON, escapes and unicode.
#[rustfmt::skip]
const TRICKY: &[&str] = &[
    "", "1", "01", " 1", "1 ", "1.0", "-0", "+1", "1e400", "-1e400", "NaN", "nan",
    "Infinity", "-Infinity", "true", "null", "[]", "{}", "0x10", "9223372036854775808",
    "a", "A", "b", "é", "e\u{301}", "\"", "\\", "'", "\u{1}", "\u{7f}", "\u{fffd}",
    "\u{1F600}", "x\u{200b}", "id", "revision", "tenant",
    "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11", "{A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11}",
    "a0eebc999c0b4ef8bb6d6bb9bd380a11", "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a1",
    "2024-02-29", "2023-02-29", "infinity",
];

fn tricky_string() -> impl Strategy<Value = String> {
    prop_oneof![
        select(TRICKY).prop_map(str::to_string),
        "\\PC{0,12}",
        ".{0,6}",
    ]
}

/// A field name: the target's own columns most of the time (so that lists get past the
/// column check), else names it does not have.
fn field_name() -> impl Strategy<Value = String> {
    let mut names: Vec<&str> = vec!["id", "revision", "tenant"];
    names.extend(GUARDS.iter().map(|(n, _)| *n));
    prop_oneof![
        6 => select(names).prop_map(str::to_string),
        1 => select(vec!["", " id", "ID", "Id", "id ", "nope", "\"id\"", "revision\u{0}"])
            .prop_map(str::to_string),
        1 => tricky_string(),
    ]
}

fn leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        1 => Just(Value::Null),
        1 => any::<bool>().prop_map(Value::Bool),
        3 => number(),
        3 => tricky_string().prop_map(Value::String),
    ]
}

/// Any JSON value, nested a few levels deep.
fn json_value() -> impl Strategy<Value = Value> {
    leaf().prop_recursive(6, 48, 6, |inner| {
        prop_oneof![
            vec(inner.clone(), 0..6).prop_map(Value::Array),
            vec((field_name(), inner), 0..6)
                .prop_map(|fields| Value::Object(fields.into_iter().collect())),
        ]
    })
}

fn uuid_text(n: u8, form: u8, upper: bool) -> String {
    let bytes = [
        n, 0x0e, 0xeb, 0xc9, 0x9c, 0x0b, 0x4e, 0xf8, 0xbb, 0x6d, 0x6b, 0xb9, 0xbd, 0x38, 0x0a, n,
    ];
    let mut text = Key::Uuid(bytes).text();
    if upper {
        text = text.to_uppercase();
    }
    match form % 3 {
        0 => text,
        1 => text.replace('-', ""),
        _ => format!("{{{text}}}"),
    }
}

/// A key as a caller might send it: few distinct values, so that duplicates (also of
/// one uuid in different spellings) are common, plus anything at all now and then.
fn key_value() -> impl Strategy<Value = Value> {
    prop_oneof![
        4 => (-3i64..20).prop_map(Value::from),
        2 => boundary_integer(),
        2 => select(vec!["1", "01", "1.0", "a", "A", "b", "", "é", "e\u{301}", "\u{1F600}", "\"", "\\"])
            .prop_map(|s| json!(s)),
        2 => (0u8..4, any::<u8>(), any::<bool>())
            .prop_map(|(n, form, upper)| json!(uuid_text(n, form, upper))),
        1 => select(vec![json!(1.0), json!(1.5), json!(-0.0), json!(1e19)]),
        1 => json_value(),
    ]
}

fn revision_value() -> impl Strategy<Value = Value> {
    prop_oneof![
        6 => (0i64..4).prop_map(Value::from),
        2 => boundary_integer(),
        1 => select(vec![json!(1.0), json!("3"), json!(null), json!(true), json!([1])]),
        1 => json_value(),
    ]
}

/// An object shaped like an item, right or wrong in every way an item can be.
fn item_like() -> impl Strategy<Value = Value> {
    (
        option::weighted(0.95, key_value()),
        option::weighted(0.95, revision_value()),
        option::weighted(0.03, json_value()),
        vec((field_name(), leaf()), 0..4),
    )
        .prop_map(|(key, revision, tenant, fields)| {
            let mut object: Map<String, Value> = fields.into_iter().collect();
            if let Some(key) = key {
                object.insert("id".into(), key);
            }
            if let Some(revision) = revision {
                object.insert("revision".into(), revision);
            }
            if let Some(tenant) = tenant {
                object.insert("tenant".into(), tenant);
            }
            Value::Object(object)
        })
}

/// An `items` argument: mostly a list of item-like objects, sometimes with one foreign
/// element in it, sometimes not a list at all.
fn items_like() -> impl Strategy<Value = Value> {
    prop_oneof![
        6 => vec(item_like(), 0..10).prop_map(Value::Array),
        2 => (vec(item_like(), 0..10), json_value(), any::<prop::sample::Index>()).prop_map(
            |(mut list, stranger, at)| {
                let at = at.index(list.len() + 1);
                list.insert(at, stranger);
                Value::Array(list)
            }
        ),
        1 => json_value(),
    ]
}

// valid lists -----------------------------------------------------------------------------

/// A number as prices and ratios are written, in the plain notation jsonb prints, with
/// up to 38 significant digits: far beyond a double's, and each must come back from
/// storage exactly as written.
fn decimal() -> impl Strategy<Value = Value> {
    (any::<bool>(), any::<u128>(), 1usize..=20).prop_map(|(negative, m, scale)| {
        let digits = format!("{m:0>width$}", width = scale + 1);
        let (whole, fraction) = digits.split_at(digits.len() - scale);
        let sign = if negative { "-" } else { "" };
        serde_json::from_str(&format!("{sign}{whole}.{fraction}")).unwrap()
    })
}

/// A guard value its column accepts.
fn valid_guard() -> impl Strategy<Value = (String, Value)> {
    prop_oneof![
        (prop_oneof![Just(i32::MIN as i64), Just(i32::MAX as i64), -5i64..5])
            .prop_map(|v| ("qty".to_string(), json!(v))),
        (i16::MIN as i64..=i16::MAX as i64).prop_map(|v| ("small".to_string(), json!(v))),
        any::<i64>().prop_map(|v| ("big".to_string(), json!(v))),
        tricky_string().prop_map(|v| ("status".to_string(), json!(v))),
        decimal().prop_map(|v| ("price".to_string(), v)),
        decimal().prop_map(|v| ("ratio".to_string(), v)),
        any::<bool>().prop_map(|v| ("flag".to_string(), json!(v))),
        (0u8..4, any::<u8>(), any::<bool>())
            .prop_map(|(n, f, u)| ("ref".to_string(), json!(uuid_text(n, f, u)))),
        prop_oneof![tricky_string().prop_map(Value::String), decimal()]
            .prop_map(|v| ("due".to_string(), v)),
        tricky_string().prop_map(|v| ("say \"hi\"".to_string(), json!(v))),
        (-5i64..5).prop_map(|v| ("größe".to_string(), json!(v))),
        select(GUARDS.to_vec()).prop_map(|(n, _)| (n.to_string(), Value::Null)),
    ]
}

/// A key of the given key type, the `n`th of a set of distinct ones, in one of the
/// spellings the type accepts.
fn valid_key(key_type: &str, n: u16, spelling: u8) -> Value {
    match key_type {
        "int2" => json!(n as i64 + i16::MIN as i64),
        "int4" => json!((n as i64 + i16::MIN as i64) * 65_535),
        "int8" => json!(if n == 0 {
            i64::MIN
        } else {
            (n as i64) * 1_000_000_000_007
        }),
        "uuid" => {
            let mut bytes = [0u8; 16];
            bytes[..2].copy_from_slice(&n.to_be_bytes());
            bytes[15] = spelling;
            let text = Key::Uuid(bytes).text();
            json!(match spelling % 4 {
                0 => text,
                1 => text.to_uppercase(),
                2 => text.replace('-', ""),
                _ => format!("{{{text}}}"),
            })
        }
        _ => {
            let base = ["k", "K", "é", "\u{1F600}", "\"", ""][spelling as usize % 6];
            json!(format!("{base}{n}"))
        }
    }
}

/// A list the shape accepts: distinct keys, revisions in range, guards of the right
/// types, the object's fields in any order.
fn valid_items(
    key_type: &'static str,
    revision_type: &'static str,
) -> impl Strategy<Value = Vec<Value>> {
    let max_revision = if revision_type == "int2" {
        i16::MAX as i64
    } else {
        i32::MAX as i64
    };
    btree_set(any::<u16>(), 1..40)
        .prop_flat_map(move |keys| {
            let n = keys.len();
            (
                Just(keys.into_iter().collect::<Vec<_>>()),
                vec(any::<u8>(), n),
                vec(prop_oneof![0i64..5, Just(max_revision)], n),
                vec(vec(valid_guard(), 0..4), n),
            )
        })
        .prop_map(move |(keys, spellings, revisions, guards)| {
            keys.iter()
                .zip(spellings)
                .zip(revisions)
                .zip(guards)
                .map(|(((key, spelling), revision), guards)| {
                    let mut object: Map<String, Value> = guards.into_iter().collect();
                    object.insert("id".into(), valid_key(key_type, *key, spelling));
                    object.insert("revision".into(), json!(revision));
                    Value::Object(object)
                })
                .collect()
        })
}

fn valid_case() -> impl Strategy<Value = (Shape, Vec<Value>)> {
    (select(KEY_TYPES), select(REVISION_TYPES))
        .prop_flat_map(|(k, r)| (Just(shape(k, r)), valid_items(k, r)))
}

// checks ------------------------------------------------------------------------------------

/// A refusal a caller can act on: the user errors normalization may raise, in
/// PostgreSQL's message style, never contradicting itself.
fn assert_clear_error(shape: &Shape, error: &BatchError, input: &Value) {
    match error {
        BatchError::InvalidArgument { message, detail } => {
            assert!(
                !message.is_empty() && !message.ends_with('.'),
                "{message:?} for {input}"
            );
            assert!(
                !message.starts_with(|c: char| c.is_uppercase()),
                "{message:?} for {input}"
            );
            let detail = detail
                .as_deref()
                .unwrap_or_else(|| panic!("{message:?} has no detail"));
            assert!(detail.ends_with('.'), "{detail:?} for {input}");
            assert!(
                !detail.starts_with(|c: char| c.is_lowercase()),
                "{detail:?} for {input}"
            );
            // "... must be an integer, not an integer." tells the caller nothing.
            if let Some((_, rest)) = detail.split_once(" must be ") {
                if let Some((wanted, got)) = rest.split_once(", not ") {
                    assert_ne!(wanted, got.trim_end_matches('.'), "{detail:?} for {input}");
                }
            }
        }
        BatchError::UndefinedColumn { column, .. } => {
            assert!(
                !shape.columns.contains_key(column),
                "{column:?} exists, for {input}"
            );
        }
        other => panic!("normalizing {input} raised {other:?}, which is not a user error"),
    }
    let code = error.sqlstate();
    assert!(
        matches!(
            code,
            pgrx::PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE
                | pgrx::PgSqlErrorCode::ERRCODE_UNDEFINED_COLUMN
        ),
        "{code:?} for {input}"
    );
}

/// The invariants of a normal form made from `input`. With `any_float`, the input may
/// hold floats an f64 does not bring back from its printed form exactly (see
/// `decimal`), and only the other guards are held to coming back from storage unchanged.
fn assert_normal_form(shape: &Shape, input: &Value, items: &[Item], any_float: bool) {
    let list = input.as_array().expect("only a list normalizes");
    assert_eq!(items.len(), list.len(), "{input}");
    let key_kind = shape.columns[shape.key.columns()[0].as_str()].kind;
    let Kind::Int {
        min: rmin,
        max: rmax,
    } = shape.columns[shape.guard.column().unwrap()].kind
    else {
        panic!("revision column is not an integer");
    };
    for pair in items.windows(2) {
        assert!(
            pair[0].key < pair[1].key,
            "keys not unique and ascending: {pair:?}"
        );
    }
    let mut sources: HashMap<Key, &Map<String, Value>> = HashMap::new();
    for item in items {
        match (&item.key, key_kind) {
            (Key::Int(i), Kind::Int { min, max }) => assert!((min..=max).contains(i)),
            (Key::Text(_), Kind::Text) | (Key::Uuid(_), Kind::Uuid) => {}
            (key, kind) => panic!("key {key:?} in a column of kind {kind:?}"),
        }
        assert!((rmin..=rmax).contains(&item.revision), "{item:?}");
        // The stored key reads back as the same key, so a stored approval compares equal.
        assert_eq!(
            Key::from_text(KeyOrder::Here(key_kind), &item.key.text()),
            item.key
        );
        for (column, value) in &item.guards.entries() {
            assert!(shape.columns.contains_key(column), "{column:?}");
            assert!(
                !shape.roles().any(|r| r == column),
                "{column:?} became a guard"
            );
            if any_float && value.is_f64() {
                continue;
            }
            let stored: Value = serde_json::from_str(item.guards.canonical()).unwrap();
            assert_eq!(
                stored.get(column),
                Some(value),
                "guards do not survive storage"
            );
        }
    }
    // Every input object is one normal item, with all its other fields as guards.
    for object in list {
        let object = object
            .as_object()
            .expect("an item that is not an object normalized");
        let item = items
            .iter()
            .find(|i| {
                object[shape.key.columns()[0].as_str()] == json!(i.key.text())
                    || object[shape.key.columns()[0].as_str()]
                        .as_i64()
                        .map(Key::Int)
                        .as_ref()
                        == Some(&i.key)
                    || object[shape.key.columns()[0].as_str()]
                        .as_str()
                        .and_then(parse_uuid)
                        .map(Key::Uuid)
                        .as_ref()
                        == Some(&i.key)
            })
            .unwrap_or_else(|| panic!("item {object:?} is missing from the normal form"));
        assert!(
            sources.insert(item.key.clone(), object).is_none(),
            "two items, one key"
        );
        assert_eq!(
            Some(item.revision),
            object[shape.guard.column().unwrap()].as_i64()
        );
        let fields: Guards = object
            .iter()
            .filter(|(k, _)| {
                k.as_str() != shape.key.columns()[0].as_str()
                    && k.as_str() != shape.guard.column().unwrap()
            })
            .map(|(k, v)| (k.clone(), canon(v)))
            .collect();
        assert_eq!(item.guards, fields);
    }
}

/// A value as the normal form keeps it: a number in its one canonical spelling.
fn canon(v: &Value) -> Value {
    match v {
        Value::Number(n) => serde_json::from_str(&canonical_number(&n.to_string())).unwrap(),
        other => other.clone(),
    }
}

/// The approval as `load_approval` rebuilds it from the stored rows: keys from their
/// text, guards from their canonical JSON.
fn as_stored(key_kind: Kind, items: &[Item]) -> Vec<Item> {
    items
        .iter()
        .map(|i| Item {
            key: Key::from_text(KeyOrder::Here(key_kind), &i.key.text()),
            revision: i.revision,
            guards: match serde_json::from_str(i.guards.canonical()).unwrap() {
                Value::Object(m) => m.into_iter().collect(),
                other => panic!("guards stored as {other}"),
            },
        })
        .collect()
}

// properties ----------------------------------------------------------------------------------

proptest! {
    #![proptest_config(config(1000))]

    /// Random JSON of every kind: a normal form or a clear error, never a panic.
    #[test]
    fn any_json_normalizes_or_is_refused_clearly(shape in any_shape(), input in items_like()) {
        match shape.normalize(&input) {
            Ok(items) => assert_normal_form(&shape, &input, &items, true),
            Err(e) => assert_clear_error(&shape, &e, &input),
        }
    }

    /// Whether a list is accepted, and what it normalizes to, does not depend on the
    /// order of its items.
    #[test]
    fn item_order_changes_nothing(
        shape in any_shape(),
        (list, shuffled) in vec(item_like(), 1..10)
            .prop_flat_map(|l| (Just(l.clone()), Just(l).prop_shuffle())),
    ) {
        let (a, b) = (shape.normalize(&Value::Array(list)), shape.normalize(&Value::Array(shuffled)));
        match (a, b) {
            (Ok(a), Ok(b)) => {
                prop_assert_eq!(&a, &b);
                prop_assert_eq!(approval(a).fingerprint(), approval(b).fingerprint());
            }
            (Err(_), Err(_)) => {}
            (a, b) => prop_assert!(false, "one order accepted, the other refused: {:?} / {:?}", a, b),
        }
    }

    /// set_values and expect: an object of known columns with values of their types, or
    /// a clear error.
    #[test]
    fn column_objects_are_checked(shape in any_shape(), input in json_value()) {
        match shape.check_columns_object("set_values", &input) {
            Ok(checked) => {
                let object = input.as_object().expect("only an object is accepted");
                prop_assert_eq!(checked.len(), object.len());
                for (column, value) in object {
                    prop_assert!(shape.columns.contains_key(column));
                    prop_assert_eq!(checked.get(column), Some(&canon(value)));
                }
            }
            Err(e) => assert_clear_error(&shape, &e, &input),
        }
    }

    /// jsonb hands its arguments over as text: every text reads as JSON or is refused
    /// with a clear error naming the argument.
    #[test]
    fn any_text_reads_or_is_refused_clearly(text in prop_oneof![
        "\\PC{0,40}",
        "[\\[\\]{}:,\"0-9a-z.eE+\\- ]{0,40}",
        json_value().prop_map(|v| v.to_string()),
        (json_value(), 0usize..40).prop_map(|(v, cut)| {
            let t = v.to_string();
            t.char_indices().nth(cut).map(|(i, _)| t[..i].to_string()).unwrap_or(t)
        }),
    ]) {
        match read_json("items", &text) {
            Ok(v) => {
                let plain: Option<Value> = serde_json::from_str(&text).ok();
                prop_assert_eq!(Some(v), plain);
            }
            Err(e) => {
                prop_assert!(matches!(&e, BatchError::InvalidArgument { .. }), "{:?}", e);
                prop_assert!(e.message().starts_with("items "), "{}", e.message());
            }
        }
    }
}

proptest! {
    #![proptest_config(config(200))]

    /// Lists that are valid by construction are accepted, in every key type; their
    /// normal form is the same in any item order and survives being stored and read
    /// back.
    #[test]
    fn valid_lists_normalize_the_same_in_any_order(
        (shape, list, shuffled) in valid_case()
            .prop_flat_map(|(s, l)| (Just(s), Just(l.clone()), Just(l).prop_shuffle())),
    ) {
        let input = Value::Array(list);
        let items = shape.normalize(&input).unwrap_or_else(|e| panic!("{e:?} for {input}"));
        assert_normal_form(&shape, &input, &items, false);
        let again = shape.normalize(&Value::Array(shuffled)).unwrap();
        let key_kind = shape.columns[shape.key.columns()[0].as_str()].kind;
        let stored = approval(as_stored(key_kind, &items));
        let (a, b) = (approval(items), approval(again));
        prop_assert_eq!(a.fingerprint(), b.fingerprint());
        prop_assert_eq!(a.difference(&b), None);
        prop_assert_eq!(stored.fingerprint(), a.fingerprint());
        prop_assert_eq!(stored.difference(&a), None);
    }

    /// A change to one item changes the fingerprint, and the difference names that item.
    #[test]
    fn a_changed_item_is_named(
        (shape, list) in valid_case(),
        which in any::<prop::sample::Index>(),
        change in 0u8..3,
    ) {
        let items = shape.normalize(&Value::Array(list.clone())).unwrap();
        let mut changed = list;
        let at = which.index(changed.len());
        let object = changed[at].as_object_mut().unwrap();
        let (field, value) = match change {
            0 => ("revision", json!(object["revision"].as_i64().unwrap() - 1)),
            1 => {
                let status = object.get("status").map(Value::to_string).unwrap_or_default();
                ("status", json!(format!("{status}!")))
            }
            _ => ("flag", json!(!object.get("flag").and_then(Value::as_bool).unwrap_or(false))),
        };
        object.insert(field.into(), value);
        let key = shape.normalize(&Value::Array(vec![changed[at].clone()])).unwrap()[0].key.clone();
        let (a, b) = (approval(items), approval(shape.normalize(&Value::Array(changed)).unwrap()));
        prop_assert_ne!(a.fingerprint(), b.fingerprint());
        let difference = a.difference(&b).expect("a difference is named");
        prop_assert!(
            difference.starts_with(&format!("Item {} was approved", key.text())),
            "{}", difference
        );
    }
}

// fixed hostile inputs ------------------------------------------------------------------------

/// Values nested `depth` levels deep, built without recursion.
fn nested(depth: usize, object: bool) -> Value {
    let mut v = json!(1);
    for _ in 0..depth {
        v = if object {
            json!({ "qty": v })
        } else {
            json!([v])
        };
    }
    v
}

#[test]
fn deep_nesting_is_refused_without_recursing() {
    let s = shape("int4", "int4");
    // Dropping a deeply nested serde_json value recurses once per level: keep the
    // depth within what a test thread's stack holds.
    for depth in [1, 127, 128, 1_000] {
        for object in [false, true] {
            let deep = nested(depth, object);
            for input in [
                deep.clone(),
                json!([deep.clone()]),
                json!([{"id": 1, "revision": 1, "qty": deep.clone()}]),
                json!([{"id": deep.clone(), "revision": 1}]),
                json!([{"id": 1, "revision": deep.clone()}]),
            ] {
                let e = s.normalize(&input).unwrap_err();
                assert_clear_error(&s, &e, &json!("deep"));
            }
            let e = s
                .check_columns_object("expect", &json!({ "qty": deep }))
                .unwrap_err();
            assert_clear_error(&s, &e, &json!("deep"));
        }
    }
}

#[test]
fn text_nested_deeper_than_serde_json_reads_is_refused_clearly() {
    for depth in [127, 128, 129, 10_000, 100_000] {
        for (open, close) in [("[", "]"), ("{\"a\":", "}")] {
            let text = format!("{}1{}", open.repeat(depth), close.repeat(depth));
            match read_json("items", &text) {
                Ok(_) => assert!(depth <= 127, "depth {depth} read"),
                Err(e) => {
                    assert!(depth > 127, "depth {depth}: {e:?}");
                    assert_eq!(e.message(), "items is nested too deeply");
                    assert_eq!(
                        e.sqlstate(),
                        pgrx::PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE
                    );
                }
            }
        }
    }
}

#[test]
fn numbers_keep_every_digit() {
    // jsonb prints numerics in full: 1e400 arrives as a 1 and 400 zeros, and a numeric
    // column may hold every one of them.
    for (text, canonical) in [
        (
            format!("1{}", "0".repeat(400)),
            format!("1{}", "0".repeat(400)),
        ),
        ("1e400".to_string(), format!("1{}", "0".repeat(400))),
        (
            format!("-1{}.50", "0".repeat(309)),
            format!("-1{}.5", "0".repeat(309)),
        ),
        (
            format!("0.{}1", "0".repeat(400)),
            format!("0.{}1", "0".repeat(400)),
        ),
        (
            "0.1000000000000000001".to_string(),
            "0.1000000000000000001".to_string(),
        ),
        (
            "18446744073709551615".to_string(),
            "18446744073709551615".to_string(),
        ),
    ] {
        let value = read_json("set_values", &text).unwrap();
        assert_eq!(
            canonical_number(&value.to_string()),
            canonical,
            "{text:.40}"
        );
    }
}

#[test]
fn integers_out_of_range_say_so() {
    let s = shape("int8", "int4");
    let e = s
        .normalize(&json!([{"id": u64::MAX, "revision": 1}]))
        .unwrap_err();
    assert_eq!(e.message(), "item 1 has a key out of range");
    assert_eq!(
        e.detail().unwrap(),
        "18446744073709551615 does not fit key column \"id\" of type int8."
    );
    let e = s
        .normalize(&json!([{"id": 1, "revision": 1, "qty": 3_000_000_000i64}]))
        .unwrap_err();
    assert_eq!(
        e.message(),
        "item 1 has a value out of range for column \"qty\""
    );
    assert_eq!(
        e.detail().unwrap(),
        "3000000000 does not fit column \"qty\" of type int4."
    );
    let e = s
        .check_columns_object("expect", &json!({"small": 40_000}))
        .unwrap_err();
    assert_eq!(
        e.message(),
        "expect has a value out of range for column \"small\""
    );
}

#[test]
fn one_key_spelled_three_ways_is_one_key_or_a_wrong_type() {
    // In an integer column, 1.0 and "1" are not integers; in a text column, 1 is not
    // a string; in a uuid column, every spelling of one uuid is the same key.
    let int = shape("int4", "int4");
    let e = int
        .normalize(&json!([{"id": 1, "revision": 1}, {"id": 1.0, "revision": 1}]))
        .unwrap_err();
    assert_eq!(e.message(), "item 2 has a key of the wrong type");
    let e = int
        .normalize(&json!([{"id": 1, "revision": 1}, {"id": "1", "revision": 1}]))
        .unwrap_err();
    assert_eq!(e.message(), "item 2 has a key of the wrong type");
    let text = shape("text", "int4");
    let items = text
        .normalize(&json!([{"id": "1", "revision": 1}, {"id": "01", "revision": 1}, {"id": "1.0", "revision": 1}]))
        .unwrap();
    assert_eq!(items.len(), 3);
    let uuid = shape("uuid", "int4");
    let e = uuid
        .normalize(&json!([
            {"id": uuid_text(1, 0, false), "revision": 1},
            {"id": uuid_text(1, 2, true), "revision": 1},
        ]))
        .unwrap_err();
    assert_eq!(e.message(), "items contain a duplicate key");
}

#[test]
fn a_bad_element_at_the_end_of_a_long_list_is_found() {
    let s = shape("int8", "int8");
    let mut list: Vec<Value> = (0..100_000)
        .map(|i| json!({"id": i, "revision": 1}))
        .collect();
    list.push(json!({"id": "100000", "revision": 1}));
    let e = s.normalize(&Value::Array(list)).unwrap_err();
    assert_eq!(e.message(), "item 100001 has a key of the wrong type");
}

#[test]
fn one_column_in_two_roles_is_refused() {
    for (key, tenant, revision, message) in [
        (
            "id",
            "tenant",
            "id",
            "column \"id\" cannot be both the key and the revision column",
        ),
        (
            "tenant",
            "tenant",
            "revision",
            "column \"tenant\" cannot be both the key and the tenant column",
        ),
        (
            "id",
            "qty",
            "qty",
            "column \"qty\" cannot be both the tenant and the revision column",
        ),
    ] {
        let mut s = shape("int4", "int4");
        (s.key, s.tenant_column, s.guard) = (
            JobKey::one(key),
            Some(tenant.into()),
            Guard::Revision {
                column: revision.into(),
            },
        );
        let e = s.check_roles().unwrap_err();
        assert_eq!(e.message(), message);
        assert_clear_error(&s, &e, &json!([key, tenant, revision]));
    }
}

proptest! {
    #![proptest_config(config(1000))]

    /// Any three column names, existing or not: roles the job can work with, or a clear
    /// error.
    #[test]
    fn column_roles_are_checked(
        shape in any_shape(),
        names in [field_name(), field_name(), field_name()],
    ) {
        let mut shape = shape;
        let [key, tenant, revision] = names;
        (shape.key, shape.tenant_column, shape.guard) = (
            JobKey::one(&key),
            Some(tenant.clone()),
            Guard::Revision { column: revision.clone() },
        );
        match shape.check_roles() {
            Ok(()) => {
                prop_assert!(key != tenant);
                prop_assert!(key != revision);
                prop_assert!(tenant != revision);
                prop_assert!(shape.columns.contains_key(&key));
                prop_assert!(shape.columns.contains_key(&tenant));
                assert!(matches!(shape.columns[&revision].kind, Kind::Int { .. }));
            }
            Err(BatchError::Unsupported { message, .. }) => {
                prop_assert!(message.starts_with("key column"), "{}", message);
            }
            Err(e) => assert_clear_error(&shape, &e, &json!("roles")),
        }
    }
}
