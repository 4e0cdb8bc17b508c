//! The approved list: parsed, checked against the target's columns, normalized by key
//! order and fingerprinted. Pure Rust, so every rule here is unit-tested (and fuzzed)
//! without a database.
//!
//! Normal form: items sorted by key in the key column's own type (integers by value,
//! uuids by their bytes as PostgreSQL orders them, text by its bytes, that is in the "C"
//! collation, so the order never depends on a locale), each with its revision and its
//! guards in column-name order. Two registrations are the same request exactly when
//! their normal forms are equal, whatever order the caller listed the items in.

use crate::error::{BatchError, Result};
use crate::job::rules::columns::json_kind;
use crate::job::rules::guard::Guard;
pub use crate::job::rules::key::Key;
use crate::job::rules::key::{JobKey, KeyOrder};
use crate::job::rules::shape::Shape;
use serde_json::Value;
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::fmt::Write as _;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Item {
    pub key: Key,
    pub revision: i64,
    /// Every other field of the item: a column that must still hold this value.
    pub guards: Guards,
}

/// An item's guards, column -> value, kept as the canonical JSON text (canonical_object)
/// the frozen list stores and the fingerprint hashes: one short string an item, made
/// once, where a list of a million items would otherwise hold a million small maps.
/// Equal texts are equal guards: the canonical form has one spelling per content.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Guards(String);

impl Guards {
    /// Guards from JSON text `text` (an object as PostgreSQL prints it, or as etc_batch
    /// stored it), each number in its one spelling. A flat object of strings, integers,
    /// booleans and nulls without escapes, which is what nearly every item holds, is
    /// put in order without being parsed into values (flat_entries).
    pub fn read(text: &str) -> Guards {
        let Some(mut entries) = flat_entries(text) else {
            return parse_canonical_object(text).into_iter().collect();
        };
        entries.sort_unstable_by(|a, b| a.0.cmp(b.0));
        if entries.windows(2).any(|w| w[0].0 == w[1].0) {
            return parse_canonical_object(text).into_iter().collect();
        }
        if entries.is_empty() {
            return Guards::default();
        }
        let mut out = String::with_capacity(text.len());
        out.push('{');
        for (i, (column, value)) in entries.into_iter().enumerate() {
            if i > 0 {
                out.push_str(", ");
            }
            out.push('"');
            out.push_str(column);
            out.push_str("\": ");
            if value.starts_with('{') {
                // a nested flat object, put in order the same way
                out.push_str(Guards::read(value).canonical());
            } else {
                out.push_str(value);
            }
        }
        out.push('}');
        Guards(out)
    }

    /// JSON text with the columns in order, as canonical_object writes a map.
    pub fn canonical(&self) -> &str {
        if self.0.is_empty() {
            "{}"
        } else {
            &self.0
        }
    }

    /// The canonical text, for an item with guards; None for one without.
    pub fn into_text(self) -> Option<String> {
        (!self.0.is_empty()).then_some(self.0)
    }

    /// The columns guarded, in order.
    pub fn for_each_column(&self, mut visit: impl FnMut(&str)) {
        match flat_entries(self.canonical()) {
            Some(entries) => entries.into_iter().for_each(|(c, _)| visit(c)),
            None => self.entries().keys().for_each(|c| visit(c)),
        }
    }

    /// Column -> value, read back from the text: for the checks and messages that need
    /// the values themselves.
    pub fn entries(&self) -> BTreeMap<String, Value> {
        parse_object(self.canonical())
    }
}

impl FromIterator<(String, Value)> for Guards {
    fn from_iter<I: IntoIterator<Item = (String, Value)>>(entries: I) -> Guards {
        let entries: Vec<(String, Value)> = entries.into_iter().collect();
        if entries.is_empty() {
            return Guards::default();
        }
        let mut out = String::new();
        write_object(entries.iter().map(|(c, v)| (c, v)), &mut out);
        Guards(out)
    }
}

/// The entries of a JSON object in text whose every key and value is already in its
/// canonical spelling, as raw slices of `text`: keys without escapes, and values that
/// are strings without escapes, integers without leading zeros (not -0), true, false
/// or null, or (`nested`) an object of such values, as the values recorded before a
/// change are kept (change/item_values.rs). None for any other text, which is read the
/// long way.
pub fn flat_entries(text: &str) -> Option<Vec<(&str, &str)>> {
    let (entries, end) = object_at(text, 0, true)?;
    let rest = &text.as_bytes()[end..];
    rest.iter()
        .all(|c| matches!(c, b' ' | b'\t' | b'\n' | b'\r'))
        .then_some(entries)
}

/// The flat object (flat_entries) that begins at `start` in `text`, after any spaces:
/// its entries, and where it ends, past its closing brace. `nested`: whether a value may
/// be a flat object itself (one level).
fn object_at(text: &str, start: usize, nested: bool) -> Option<(Vec<(&str, &str)>, usize)> {
    let b = text.as_bytes();
    let skip_space = |at: &mut usize| {
        while *at < b.len() && matches!(b[*at], b' ' | b'\t' | b'\n' | b'\r') {
            *at += 1;
        }
    };
    // a string without escapes or control characters; the end, past its closing quote
    let string = |at: usize| -> Option<usize> {
        if b.get(at) != Some(&b'"') {
            return None;
        }
        let end = at + 1 + b[at + 1..].iter().position(|&c| c == b'"')?;
        let inside = &b[at + 1..end];
        (!inside.iter().any(|&c| c == b'\\' || c < 0x20)).then_some(end + 1)
    };
    let mut entries = Vec::new();
    let mut at = start;
    skip_space(&mut at);
    if b.get(at) != Some(&b'{') {
        return None;
    }
    at += 1;
    skip_space(&mut at);
    let mut end_of_object = b.get(at) == Some(&b'}');
    while !end_of_object {
        skip_space(&mut at);
        let key_start = at;
        at = string(at)?;
        let key = &text[key_start + 1..at - 1];
        skip_space(&mut at);
        if b.get(at) != Some(&b':') {
            return None;
        }
        at += 1;
        skip_space(&mut at);
        let value_start = at;
        match *b.get(at)? {
            b'"' => at = string(at)?,
            b't' if text[at..].starts_with("true") => at += 4,
            b'f' if text[at..].starts_with("false") => at += 5,
            b'n' if text[at..].starts_with("null") => at += 4,
            b'{' if nested => at = object_at(text, at, false)?.1,
            b'-' | b'0'..=b'9' => {
                let negative = b[at] == b'-';
                let digits = at + usize::from(negative);
                at = digits
                    + b[digits..]
                        .iter()
                        .take_while(|c| c.is_ascii_digit())
                        .count();
                let n = &b[digits..at];
                // no digits, a leading zero, or -0: not in its canonical spelling
                if n.is_empty() || (n[0] == b'0' && (n.len() > 1 || negative)) {
                    return None;
                }
            }
            _ => return None,
        }
        entries.push((key, &text[value_start..at]));
        skip_space(&mut at);
        match *b.get(at)? {
            b',' => at += 1,
            b'}' => end_of_object = true,
            _ => return None,
        }
    }
    Some((entries, at + 1))
}

impl Shape {
    /// A value meant for `column`, checked, in its one spelling: numbers canonical, so
    /// that 2.0 and 2 are the same approval.
    fn normal_value(&self, column: &str, value: &Value, context: &str) -> Result<Value> {
        self.check_value(column, value, context)?;
        Ok(match value {
            Value::Number(n) if is_plain_integer(n.as_str()) => value.clone(),
            Value::Number(n) => serde_json::from_str(&canonical_number(n.as_str()))
                .unwrap_or_else(|_| value.clone()),
            _ => value.clone(),
        })
    }

    /// Checks an object of column -> value (set_values, expect) and returns it with its
    /// keys sorted.
    pub fn check_columns_object(
        &self,
        what: &str,
        value: &Value,
    ) -> Result<BTreeMap<String, Value>> {
        let object = value.as_object().ok_or_else(|| {
            BatchError::invalid_because(
                format!("{what} must be a JSON object"),
                format!("It is {}.", json_kind(value)),
            )
        })?;
        object
            .iter()
            .map(|(column, v)| Ok((column.clone(), self.normal_value(column, v, what)?)))
            .collect()
    }

    /// Parses, checks and normalizes the approved list given as JSON text, one item at
    /// a time: the items are never all held as parsed JSON, only in their normal form.
    pub fn normalize_json(&self, what: &str, text: &str) -> Result<Vec<Item>> {
        if !text.trim_start().starts_with('[') {
            // not an array: parsed whole, to say what it is
            return self.normalize(&read_json(what, text)?);
        }
        let mut items = Vec::new();
        let mut failure = None;
        let mut de = serde_json::Deserializer::from_str(text);
        let streamed = serde::de::Deserializer::deserialize_seq(
            &mut de,
            EachItem {
                shape: self,
                items: &mut items,
                failure: &mut failure,
            },
        )
        .and_then(|()| de.end());
        if let Some(e) = failure {
            return Err(e);
        }
        streamed.map_err(|e| json_error(what, e))?;
        self.in_key_order(items)
    }

    /// Checks and normalizes an approved list of `count` items handed over one element
    /// at a time, each as JSON text, by `elements`: only one element is ever held as
    /// parsed JSON, and the list's text never whole.
    pub fn normalize_each(
        &self,
        what: &str,
        count: usize,
        elements: impl FnOnce(&mut dyn FnMut(&str) -> Result<()>) -> Result<()>,
    ) -> Result<Vec<Item>> {
        let mut items = Vec::with_capacity(count);
        elements(&mut |text| {
            let entry = read_json(what, text)?;
            items.push(self.item(&entry, items.len() + 1)?);
            Ok(())
        })?;
        self.in_key_order(items)
    }

    /// Checks and normalizes the approved list.
    pub fn normalize(&self, items: &Value) -> Result<Vec<Item>> {
        let list = items.as_array().ok_or_else(|| {
            BatchError::invalid_because(
                "items must be a JSON array",
                format!("It is {}.", json_kind(items)),
            )
        })?;
        let normalized = list
            .iter()
            .enumerate()
            .map(|(index, entry)| self.item(entry, index + 1))
            .collect::<Result<Vec<Item>>>()?;
        self.in_key_order(normalized)
    }

    /// The list sorted by key, refused when too long or with a key twice; a list whose
    /// key PostgreSQL orders is left as given, for it to order (staged.rs). An empty list
    /// is an approval of nothing, a job done at once (register.rs).
    fn in_key_order(&self, mut items: Vec<Item>) -> Result<Vec<Item>> {
        if items.len() > i32::MAX as usize {
            return Err(BatchError::invalid_because(
                "too many items",
                "An approval holds at most 2147483647 items.",
            ));
        }
        if self.key.order(&self.columns)? == KeyOrder::Sql {
            return Ok(items);
        }
        // in place: keys are compared whole, and two equal ones are refused below
        items.sort_unstable_by(|a, b| a.key.cmp(&b.key));
        if let Some(pair) = items.windows(2).find(|w| w[0].key == w[1].key) {
            return Err(duplicate_key(&pair[0].key.text()));
        }
        Ok(items)
    }

    /// Checks and normalizes item `position` (1-based) of the list.
    fn item(&self, entry: &Value, position: usize) -> Result<Item> {
        let object = entry.as_object().ok_or_else(|| {
            BatchError::invalid_because(
                format!("item {position} is not a JSON object"),
                format!("It is {}.", json_kind(entry)),
            )
        })?;
        let key = match self.key.order(&self.columns)? {
            KeyOrder::Here(_) => self.key.value(&self.columns, object, position)?,
            KeyOrder::Sql => Key::Given(self.key.parts(&self.columns, object, position)?),
        };
        let revision = match self.guard.column() {
            Some(field) => object
                .get(field)
                .ok_or_else(|| {
                    BatchError::invalid_because(
                        format!("item {position} has no revision"),
                        format!("It has no field \"{field}\"."),
                    )
                })?
                .as_i64()
                .filter(|r| self.guard.accepts(&self.columns, *r))
                .ok_or_else(|| {
                    let column = self.columns.get(field);
                    BatchError::invalid_because(
                        format!("item {position} has a revision of the wrong type"),
                        format!(
                            "Revision column \"{field}\" is {}, so the revision must be an integer in its range.",
                            column.map_or("", |c| c.type_name.as_str())
                        ),
                    )
                })?,
            // the row's digest is taken when the item is frozen; named columns keep none
            None => 0,
        };
        let mut guards = Vec::new();
        for (field, value) in object {
            if self.names_the_row(field) {
                continue;
            }
            if Some(field.as_str()) == self.tenant_column.as_deref() {
                return Err(BatchError::invalid_because(
                    format!("item {position} names the tenant column \"{field}\""),
                    "The tenant is given once for the whole job, not per item.",
                ));
            }
            let value = self.normal_value(field, value, &format!("item {position}"))?;
            guards.push((field.clone(), value));
        }
        Ok(Item {
            key,
            revision,
            guards: guards.into_iter().collect(),
        })
    }
}

/// The error for a key that appears twice in an approval.
pub fn duplicate_key(key: &str) -> BatchError {
    BatchError::invalid_because(
        "items contain a duplicate key",
        format!("Key {key} appears more than once."),
    )
}

/// Reads the elements of a JSON array one at a time into their normal form. An item that
/// fails its checks stops the parse; its error is kept in `failure`.
struct EachItem<'a> {
    shape: &'a Shape,
    items: &'a mut Vec<Item>,
    failure: &'a mut Option<BatchError>,
}

impl<'de> serde::de::Visitor<'de> for EachItem<'_> {
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON array")
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(
        self,
        mut seq: A,
    ) -> std::result::Result<(), A::Error> {
        while let Some(entry) = seq.next_element::<Value>()? {
            match self.shape.item(&entry, self.items.len() + 1) {
                Ok(item) => self.items.push(item),
                Err(e) => {
                    *self.failure = Some(e);
                    return Err(serde::de::Error::custom("an item was refused"));
                }
            }
        }
        Ok(())
    }
}

/// How deep serde_json nests before it gives up (its recursion limit).
const MAX_DEPTH: usize = 127;

/// Reads a jsonb argument from its text form (jsonb_out). Everything jsonb holds is
/// valid JSON, but serde_json nests less deeply: deeper nesting than `MAX_DEPTH` is
/// refused here, naming the argument, instead of failing in the conversion as an
/// internal error. Numbers keep every digit (arbitrary_precision), so no number is out
/// of serde_json's range.
pub fn read_json(what: &str, text: &str) -> Result<Value> {
    serde_json::from_str(text).map_err(|e| json_error(what, e))
}

/// The error for JSON text serde_json could not read.
fn json_error(what: &str, e: serde_json::Error) -> BatchError {
    let reason = e.to_string();
    if reason.starts_with("recursion limit exceeded") {
        BatchError::invalid_because(
            format!("{what} is nested too deeply"),
            format!("Arrays and objects may be nested at most {MAX_DEPTH} levels deep."),
        )
    } else {
        BatchError::invalid_because(
            format!("{what} is not valid JSON"),
            format!("The JSON parser says: {reason}."),
        )
    }
}

/// A JSON object stored by etc_batch itself (guards, set_values, expect), read back.
pub fn parse_object(text: &str) -> BTreeMap<String, Value> {
    match serde_json::from_str::<Value>(text) {
        Ok(Value::Object(m)) => m.into_iter().collect(),
        _ => BTreeMap::new(),
    }
}

/// What a job does to each item.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    Set(BTreeMap<String, Value>),
    Handler(String),
    /// Delete the row; `keep`: its content kept with its chunk's audit.
    Delete {
        keep: bool,
    },
    /// Insert the row into `archive` (its quoted, schema-qualified name) and delete it;
    /// `keep` as for Delete.
    Move {
        archive: String,
        keep: bool,
    },
    /// Insert the row again, as a delete or a move kept it, where its key is free (a
    /// revert of that job); for a move, taken back from `archive`, where it still is as
    /// it was moved.
    Restore {
        archive: Option<String>,
    },
}

/// What a registration approves besides its items: compared first when the same job id
/// comes again, and hashed first into its fingerprint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Terms {
    /// The tenant and its column; None: the whole table.
    pub tenant: Option<(String, String)>,
    pub target: String,
    pub key: JobKey,
    pub guard: Guard,
    pub chunk_size: i32,
    pub action: Action,
    pub expect: BTreeMap<String, Value>,
    /// Whether chunks may commit in any order (a parallel approval).
    pub parallel: bool,
    pub on_drift: OnDrift,
    /// Whether each item's values before the change, in the columns it sets, are
    /// recorded in its guards at registration.
    pub record_before: bool,
    /// Columns set to each item's own value, carried in its guards (a revert's).
    pub set_from_items: Vec<String>,
    /// Columns set to an expression over the row's own columns, each as PostgreSQL
    /// printed it back at registration (set_expressions).
    pub set_expressions: BTreeMap<String, String>,
}

/// What the approval says to do with an item whose row drifted or went away.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnDrift {
    /// Stop the job in conflict, for a person to decide (the seed's rule).
    Stop,
    /// Leave the item unchanged, record it as skipped with what was found, go on.
    Skip,
}

impl OnDrift {
    pub fn parse(text: &str) -> Result<OnDrift> {
        match text {
            "stop" => Ok(OnDrift::Stop),
            "skip" => Ok(OnDrift::Skip),
            other => Err(BatchError::invalid_because(
                format!("unknown on_drift \"{other}\""),
                "An item whose row drifted either stops the job (on_drift => 'stop') or is skipped and recorded (on_drift => 'skip').",
            )),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            OnDrift::Stop => "stop",
            OnDrift::Skip => "skip",
        }
    }
}

/// A whole registration in normal form: what two registrations are compared on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Approval {
    pub terms: Terms,
    pub items: Vec<Item>,
}

/// A SHA-256 of the normal form, taken one item at a time in key order, so that a list of
/// any size is hashed in the memory of one item: equal for the same request in any item
/// order, whether it came as jsonb or from a query.
pub struct Fingerprint(Sha256);

impl Fingerprint {
    pub fn begin(terms: &Terms) -> Fingerprint {
        let mut f = Fingerprint(Sha256::new());
        // a job of 0.3.0's kind (a tenant, a key of one column, a revision) hashes as it
        // did then; each term since is hashed only where it differs from that
        let (tenant, tenant_column) = terms.tenant.clone().unzip();
        f.field("tenant", tenant.as_deref().unwrap_or_default());
        f.field("target", &terms.target);
        f.field("key_column", &terms.key.describe());
        f.field(
            "tenant_column",
            tenant_column.as_deref().unwrap_or_default(),
        );
        f.field("revision_column", terms.guard.column().unwrap_or_default());
        if terms.tenant.is_none() {
            f.field("no tenant", "");
        }
        if terms.key.columns().len() > 1 {
            f.field("key_columns", &terms.key.columns().join("\u{0}"));
        }
        if terms.guard.column().is_none() {
            f.field("guard", terms.guard.kind());
        }
        if terms.on_drift != OnDrift::Stop {
            f.field("on_drift", terms.on_drift.as_str());
        }
        f.field("chunk_size", &terms.chunk_size.to_string());
        match &terms.action {
            Action::Set(values) => f.field("set_values", &canonical_object(values)),
            Action::Handler(name) => f.field("handler", name),
            Action::Delete { keep } => {
                f.field("action", "delete");
                f.field("keep_deleted", &keep.to_string());
            }
            Action::Move { archive, keep } => {
                f.field("action", "move");
                f.field("archive", archive);
                f.field("keep_deleted", &keep.to_string());
            }
            Action::Restore { archive } => {
                f.field("action", "restore");
                if let Some(archive) = archive {
                    f.field("archive", archive);
                }
            }
        }
        f.field("expect", &canonical_object(&terms.expect));
        // only when set: a sequential job hashes as it did before parallel ones existed
        if terms.parallel {
            f.field("parallel", "true");
        }
        if terms.record_before {
            f.field("record_before", "true");
        }
        if !terms.set_from_items.is_empty() {
            f.field("set_from_items", &terms.set_from_items.join("\u{0}"));
        }
        for (column, expression) in &terms.set_expressions {
            f.field("set_expression", column);
            f.field("expression", expression);
        }
        f
    }

    /// The next item, in key order; `guards` in its canonical text.
    pub fn item(&mut self, key: &str, revision: i64, guards: &str) {
        self.field("key", key);
        self.field("revision", &revision.to_string());
        self.field("guards", guards);
    }

    pub fn finish(self) -> String {
        self.0
            .finalize()
            .iter()
            .fold(String::with_capacity(64), |mut s, b| {
                let _ = write!(s, "{b:02x}");
                s
            })
    }

    fn field(&mut self, name: &str, value: &str) {
        self.0.update(name.as_bytes());
        self.0.update([0]);
        self.0.update((value.len() as u64).to_le_bytes());
        self.0.update(value.as_bytes());
    }
}

impl Terms {
    /// Names the first term in which `other` differs from these.
    pub fn difference(&self, other: &Terms) -> Option<String> {
        let tenant = |t: &Terms| {
            t.tenant
                .as_ref()
                .map_or("(none)".to_string(), |(v, _)| v.clone())
        };
        let tenant_column = |t: &Terms| {
            t.tenant
                .as_ref()
                .map_or("(none)".to_string(), |(_, c)| c.clone())
        };
        let guard = |t: &Terms| match t.guard.column() {
            Some(column) => format!("the revision column {column}"),
            None => t.guard.value_name().to_string(),
        };
        let scalar = [
            ("tenant", tenant(self), tenant(other)),
            ("target", self.target.clone(), other.target.clone()),
            ("key", self.key.describe(), other.key.describe()),
            ("tenant column", tenant_column(self), tenant_column(other)),
            ("guard", guard(self), guard(other)),
            (
                "on_drift",
                self.on_drift.as_str().into(),
                other.on_drift.as_str().into(),
            ),
        ];
        for (what, a, b) in scalar {
            if a != b {
                return Some(format!("The {what} was \"{a}\" and is now \"{b}\"."));
            }
        }
        if self.chunk_size != other.chunk_size {
            return Some(format!(
                "The chunk size was {} and is now {}.",
                self.chunk_size, other.chunk_size
            ));
        }
        if self.action != other.action {
            return Some(format!(
                "The action was {} and is now {}.",
                describe_action(&self.action),
                describe_action(&other.action)
            ));
        }
        if self.expect != other.expect {
            return Some(format!(
                "The expectations were {} and are now {}.",
                canonical_object(&self.expect),
                canonical_object(&other.expect)
            ));
        }
        if self.parallel != other.parallel {
            let order = |parallel| {
                if parallel {
                    "in any order (parallel)"
                } else {
                    "in order"
                }
            };
            return Some(format!(
                "Chunks were approved to commit {} and are now asked to commit {}.",
                order(self.parallel),
                order(other.parallel)
            ));
        }
        if self.record_before != other.record_before {
            let recorded = |r| if r { "recorded" } else { "not recorded" };
            return Some(format!(
                "The values before the change were {} and are now {}.",
                recorded(self.record_before),
                recorded(other.record_before)
            ));
        }
        if self.set_from_items != other.set_from_items {
            return Some(format!(
                "The columns set from each item were {:?} and are now {:?}.",
                self.set_from_items, other.set_from_items
            ));
        }
        if self.set_expressions != other.set_expressions {
            return Some(format!(
                "The expressions were {} and are now {}.",
                expressions_text(&self.set_expressions),
                expressions_text(&other.set_expressions)
            ));
        }
        None
    }
}

impl Approval {
    pub fn fingerprint(&self) -> String {
        let mut f = Fingerprint::begin(&self.terms);
        for item in &self.items {
            f.item(&item.key.text(), item.revision, item.guards.canonical());
        }
        f.finish()
    }

    /// Names the first thing in which `other` differs from this registration.
    pub fn difference(&self, other: &Approval) -> Option<String> {
        self.terms.difference(&other.terms).or_else(|| {
            first_difference(
                self.items
                    .iter()
                    .cloned()
                    .map(Ok::<Item, std::convert::Infallible>),
                other.items.iter().cloned().map(Ok),
                true,
            )
            .unwrap_or_else(|never| match never {})
        })
    }
}

/// The first item, in key order, in which two lists in key order differ: one that was
/// approved and is missing now, one that was not approved, or one with another revision
/// or other guards. Walks both once, side by side, so lists of any size compare in the
/// memory of one item each.
///
/// `revisions`: whether the revisions are part of the request (a job guarded by its
/// revision column) or were taken from the rows (a digest), and not compared.
pub fn first_difference<E>(
    old: impl Iterator<Item = std::result::Result<Item, E>>,
    new: impl Iterator<Item = std::result::Result<Item, E>>,
    revisions: bool,
) -> std::result::Result<Option<String>, E> {
    let (mut old, mut new) = (old.peekable(), new.peekable());
    loop {
        let a = old.peek().map(|r| r.as_ref().map(|i| i.key.clone()));
        let b = new.peek().map(|r| r.as_ref().map(|i| i.key.clone()));
        match (a, b) {
            (None, None) => return Ok(None),
            (Some(Err(_)), _) => return Err(old.next().unwrap().err().unwrap()),
            (_, Some(Err(_))) => return Err(new.next().unwrap().err().unwrap()),
            (Some(Ok(a)), Some(Ok(b))) if a == b => {
                let (a, b) = (old.next().unwrap()?, new.next().unwrap()?);
                if revisions && a.revision != b.revision {
                    return Ok(Some(format!(
                        "Item {} was approved at revision {} and is now given revision {}.",
                        a.key.text(),
                        a.revision,
                        b.revision
                    )));
                }
                if a.guards != b.guards {
                    return Ok(Some(format!(
                        "Item {} was approved with {} and is now given {}.",
                        a.key.text(),
                        a.guards.canonical(),
                        b.guards.canonical()
                    )));
                }
            }
            (Some(Ok(a)), Some(Ok(b))) if a < b => {
                return Ok(Some(format!(
                    "Item {} was approved and is missing now.",
                    a.text()
                )))
            }
            (Some(Ok(a)), None) => {
                return Ok(Some(format!(
                    "Item {} was approved and is missing now.",
                    a.text()
                )))
            }
            (_, Some(Ok(b))) => {
                return Ok(Some(format!("Item {} was not in the approval.", b.text())))
            }
        }
    }
}

/// Expressions as a JSON object of column -> expression, in column order; "none" for
/// none.
pub fn expressions_text(expressions: &BTreeMap<String, String>) -> String {
    if expressions.is_empty() {
        return "none".to_string();
    }
    canonical_object(
        &expressions
            .iter()
            .map(|(c, e)| (c.clone(), Value::String(e.clone())))
            .collect(),
    )
}

fn describe_action(action: &Action) -> String {
    match action {
        Action::Set(values) => format!("set_values {}", canonical_object(values)),
        Action::Handler(name) => format!("handler {name}"),
        Action::Delete { keep } => format!("delete{}", kept(*keep)),
        Action::Move { archive, keep } => format!("move to {archive}{}", kept(*keep)),
        Action::Restore { archive: None } => "restore of the rows deleted".to_string(),
        Action::Restore {
            archive: Some(archive),
        } => format!("restore of the rows moved to {archive}"),
    }
}

fn kept(keep: bool) -> &'static str {
    if keep {
        ""
    } else {
        " (keep_deleted false)"
    }
}

/// The object in JSON text `text`, each number in it in its one spelling
/// (canonical_number), as `parse_object(&canonical_object(&parse_object(text)))` reads
/// it, in one parse: what an items query's guards are read as, a row at a time.
pub fn parse_canonical_object(text: &str) -> BTreeMap<String, Value> {
    parse_object(text)
        .into_iter()
        .map(|(k, v)| (k, canonical_numbers(v)))
        .collect()
}

/// `value` with every number in it in its one spelling.
fn canonical_numbers(value: Value) -> Value {
    match value {
        Value::Number(n) => {
            if is_plain_integer(n.as_str()) {
                return Value::Number(n);
            }
            let text = canonical_number(n.as_str());
            serde_json::from_str(&text).unwrap_or(Value::Number(n))
        }
        Value::Array(items) => Value::Array(items.into_iter().map(canonical_numbers).collect()),
        Value::Object(map) => Value::Object(
            map.into_iter()
                .map(|(k, v)| (k, canonical_numbers(v)))
                .collect(),
        ),
        other => other,
    }
}

/// JSON text with object keys in order, the same for equal content.
pub fn canonical_object(map: &BTreeMap<String, Value>) -> String {
    let mut out = String::new();
    write_object(map.iter(), &mut out);
    out
}

/// Writes an object with its keys in order; sorts references, never copies a value.
fn write_object<'a>(entries: impl Iterator<Item = (&'a String, &'a Value)>, out: &mut String) {
    let mut entries: Vec<_> = entries.collect();
    entries.sort_unstable_by(|a, b| a.0.cmp(b.0));
    out.push('{');
    for (i, (k, v)) in entries.into_iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        write_string(k, out);
        out.push_str(": ");
        canonical_value(v, out);
    }
    out.push('}');
}

fn canonical_value(v: &Value, out: &mut String) {
    match v {
        Value::Object(m) => write_object(m.iter(), out),
        Value::Array(a) => {
            out.push('[');
            for (i, x) in a.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                canonical_value(x, out);
            }
            out.push(']');
        }
        Value::Number(n) if is_plain_integer(n.as_str()) => out.push_str(n.as_str()),
        Value::Number(n) => out.push_str(&canonical_number(n.as_str())),
        Value::String(text) => write_string(text, out),
        other => out.push_str(&other.to_string()),
    }
}

/// A JSON string, as serde_json writes it: quoted, and escaped where it must be.
fn write_string(text: &str, out: &mut String) {
    if text.bytes().any(|c| c == b'"' || c == b'\\' || c < 0x20) {
        out.push_str(&Value::String(text.to_string()).to_string());
    } else {
        out.push('"');
        out.push_str(text);
        out.push('"');
    }
}

/// Whether `text` is an integer already in its one spelling (canonical_number): digits
/// without a leading zero, perhaps after a minus, and not -0.
fn is_plain_integer(text: &str) -> bool {
    let digits = text.strip_prefix('-').unwrap_or(text);
    let b = digits.as_bytes();
    !b.is_empty()
        && b.iter().all(u8::is_ascii_digit)
        && (b[0] != b'0' || (b.len() == 1 && digits.len() == text.len()))
}

/// A JSON number in one spelling per value, with every digit kept: no exponent, no
/// leading or trailing zeros, no "-0". 2, 2.0, 2.00, 0.2e1 and 20e-1 are all "2";
/// 0.1000000000000000001 stays as it is. Numbers are read with every digit (serde_json's
/// arbitrary_precision), so two guards are the same exactly when their values are.
/// The length is bounded by jsonb's own numeric limits.
pub fn canonical_number(text: &str) -> String {
    let (negative, rest) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text),
    };
    let (mantissa, exponent) = match rest.find(['e', 'E']) {
        Some(at) => (&rest[..at], rest[at + 1..].parse::<i64>().unwrap_or(0)),
        None => (rest, 0),
    };
    let (int_part, frac_part) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    // digits d1 d2 ... dn with the decimal point after `point` of them
    let digits: String = format!("{int_part}{frac_part}");
    let point = int_part.len() as i64 + exponent;
    let lead = digits.len() - digits.trim_start_matches('0').len();
    let digits = digits.trim_matches('0');
    if digits.is_empty() {
        return "0".into();
    }
    let point = point - lead as i64;
    let mut out = String::with_capacity(digits.len() + 4);
    if negative {
        out.push('-');
    }
    if point <= 0 {
        out.push_str("0.");
        out.extend(std::iter::repeat_n('0', (-point) as usize));
        out.push_str(digits);
    } else if point as usize >= digits.len() {
        out.push_str(digits);
        out.extend(std::iter::repeat_n('0', point as usize - digits.len()));
    } else {
        out.push_str(&digits[..point as usize]);
        out.push('.');
        out.push_str(&digits[point as usize..]);
    }
    out
}

/// The approval the unit tests build on: status set to 'cancelled' on public.orders, rows
/// of tenant 'x' named by id and guarded by their revision, chunks of 10.
#[cfg(test)]
impl Approval {
    pub(crate) fn of_orders(items: Vec<Item>) -> Approval {
        Approval {
            terms: Terms {
                tenant: Some(("x".into(), "tenant".into())),
                target: "public.orders".into(),
                key: JobKey::one("id"),
                guard: Guard::Revision {
                    column: "revision".into(),
                },
                chunk_size: 10,
                action: Action::Set(BTreeMap::from([(
                    "status".to_string(),
                    Value::from("cancelled"),
                )])),
                expect: BTreeMap::new(),
                parallel: false,
                on_drift: OnDrift::Stop,
                record_before: false,
                set_from_items: Vec::new(),
                set_expressions: BTreeMap::new(),
            },
            items,
        }
    }
}

#[cfg(test)]
mod fuzz;

#[cfg(test)]
mod tests {
    #[test]
    fn numbers_have_one_spelling_per_value_and_keep_every_digit() {
        use super::canonical_number as c;
        for (given, canonical) in [
            ("2", "2"),
            ("2.0", "2"),
            ("2.00", "2"),
            ("0.2e1", "2"),
            ("20e-1", "2"),
            ("-0", "0"),
            ("-0.0e5", "0"),
            ("0", "0"),
            ("100", "100"),
            ("1e2", "100"),
            ("1.5E-3", "0.0015"),
            ("-12.340", "-12.34"),
            ("0.1000000000000000001", "0.1000000000000000001"),
            (
                "123456789012345678901234567890",
                "123456789012345678901234567890",
            ),
            ("0.000", "0"),
            ("007.50", "7.5"),
        ] {
            assert_eq!(c(given), canonical, "{given}");
        }
    }

    use super::*;

    #[test]
    fn guards_read_in_one_parse_as_in_three() {
        for text in [
            r#"{}"#,
            r#"{"qty": 1}"#,
            r#"{"qty": 2.0, "price": 0.20e1, "name": "x"}"#,
            r#"{"b": -0.0, "a": 1E+2, "c": 0.1000000000000000001}"#,
            r#"{"nested": {"z": [1.50, {"y": 20e-1}], "a": null}, "t": true}"#,
            r#"{"big": 123456789012345678901234567890.000}"#,
        ] {
            let three = parse_object(&canonical_object(&parse_object(text)));
            let one = parse_canonical_object(text);
            assert_eq!(one, three, "{text}");
            assert_eq!(canonical_object(&one), canonical_object(&three), "{text}");
        }
    }

    #[test]
    fn plain_integers_are_their_own_canonical_spelling() {
        for text in [
            "0", "7", "-7", "120", "-0", "007", "-01", "1.0", "1e2", "", "-", "+1",
        ] {
            assert_eq!(
                is_plain_integer(text),
                canonical_number(text) == text
                    && text.parse::<i128>().is_ok()
                    && !text.starts_with('+'),
                "{text}"
            );
        }
        for text in ["a\"b", "c\\d", "e\nf", "\u{1}", "ä", "plain"] {
            let mut out = String::new();
            write_string(text, &mut out);
            assert_eq!(out, Value::String(text.to_string()).to_string());
        }
    }

    #[test]
    fn flat_guards_read_as_the_long_way_reads_them() {
        for text in [
            r#"{}"#,
            r#" { } "#,
            r#"{"qty": 2}"#,
            r#"{"b": 1, "a": "x", "ab": -12, "A": true, "c": false, "d": null}"#,
            r#"{ "qty" :3 ,"name":"ä ü"}"#,
            r#"{"qty": 0}"#,
            // the values recorded before a change, one object deep
            r#"{"region": "eu", "": {"region": null}}"#,
            r#"{"": {"b": 2, "a": "x"}, "z": 1}"#,
            r#"{"": {}, "a": 1}"#,
            r#"{"": {"a": 1, "a": 2}}"#,
            r#"{"": {"b": 2.0}, "z": 1}"#,
            r#"{"x": {"y": {"z": 1}}}"#,
            // read the long way: not flat, or not in canonical spelling
            r#"{"qty": -0}"#,
            r#"{"qty": 2.0, "n": 1e2}"#,
            r#"{"qty": 007}"#,
            r#"{"a": "x\"y", "b": "\u00e4"}"#,
            r#"{"a\n": 1}"#,
            r#"{"a": {"c": 1, "b": 2}, "z": [2, 1]}"#,
            r#"{"a": 1, "a": 2}"#,
            r#"{"a": 1,}"#,
            r#"{"a": 1} x"#,
            r#"{"a": tru}"#,
            r#"{"a": -}"#,
            r#"[1]"#,
            r#""#,
        ] {
            let long_way: Guards = parse_canonical_object(text).into_iter().collect();
            assert_eq!(Guards::read(text), long_way, "{text}");
            let mut columns = Vec::new();
            long_way.for_each_column(|c| columns.push(c.to_string()));
            let keys: Vec<String> = long_way.entries().into_keys().collect();
            assert_eq!(columns, keys, "{text}");
        }
        assert_eq!(
            Guards::read(r#"{"b": 1, "a": "x"}"#).canonical(),
            r#"{"a": "x", "b": 1}"#
        );
        assert!(flat_entries(r#"{"qty": 2, "name": "x"}"#).is_some());
        assert!(flat_entries(r#"{"qty": 2.5}"#).is_none());
        assert!(flat_entries(r#"{"": {"region": null}, "region": "eu"}"#).is_some());
        assert!(flat_entries(r#"{"x": {"y": {"z": 1}}}"#).is_none());
        assert_eq!(
            Guards::read(r#"{"region": "eu", "": {"b": 2, "a": null}}"#).canonical(),
            r#"{"": {"a": null, "b": 2}, "region": "eu"}"#
        );
    }

    use serde_json::json;

    fn shape(key_type: &str) -> Shape {
        Shape::of_orders(&[
            ("id", key_type),
            ("tenant", "text"),
            ("revision", "int4"),
            ("qty", "int4"),
            ("status", "text"),
            ("price", "numeric"),
        ])
    }

    fn approval(items: Vec<Item>) -> Approval {
        Approval::of_orders(items)
    }

    #[test]
    fn integer_keys_sort_by_value_not_text() {
        let items = shape("int8")
            .normalize(&json!([{"id": 10, "revision": 1}, {"id": 9, "revision": 1}, {"id": 100, "revision": 2}]))
            .unwrap();
        let keys: Vec<String> = items.iter().map(|i| i.key.text()).collect();
        assert_eq!(keys, ["9", "10", "100"]);
    }

    #[test]
    fn the_same_request_in_another_order_has_the_same_fingerprint() {
        let s = shape("int4");
        let a = s
            .normalize(
                &json!([{"id": 1, "revision": 3, "qty": 2}, {"id": 2, "revision": 1, "qty": 5}]),
            )
            .unwrap();
        let b = s
            .normalize(
                &json!([{"qty": 5, "revision": 1, "id": 2}, {"id": 1, "qty": 2, "revision": 3}]),
            )
            .unwrap();
        assert_eq!(approval(a.clone()).fingerprint(), approval(b).fingerprint());
        let c = s
            .normalize(
                &json!([{"id": 1, "revision": 3, "qty": 3}, {"id": 2, "revision": 1, "qty": 5}]),
            )
            .unwrap();
        let (a, c) = (approval(a), approval(c));
        assert_ne!(a.fingerprint(), c.fingerprint());
        assert_eq!(
            a.difference(&c).unwrap(),
            "Item 1 was approved with {\"qty\": 2} and is now given {\"qty\": 3}."
        );
    }

    #[test]
    fn differences_name_what_changed() {
        let s = shape("int4");
        let items = s.normalize(&json!([{"id": 1, "revision": 3}])).unwrap();
        let a = approval(items.clone());
        let mut b = a.clone();
        b.terms.tenant = Some(("y".into(), "tenant".into()));
        assert_eq!(
            a.difference(&b).unwrap(),
            "The tenant was \"x\" and is now \"y\"."
        );
        let mut b = a.clone();
        b.terms.chunk_size = 5;
        assert_eq!(
            a.difference(&b).unwrap(),
            "The chunk size was 10 and is now 5."
        );
        let mut b = a.clone();
        b.terms.action = Action::Handler("public.cancel(jsonb)".into());
        assert!(a
            .difference(&b)
            .unwrap()
            .starts_with("The action was set_values"));
        let mut b = a.clone();
        b.terms.set_expressions =
            BTreeMap::from([("total_cents".to_string(), "round(t.total)".to_string())]);
        assert_eq!(
            a.difference(&b).unwrap(),
            "The expressions were none and are now {\"total_cents\": \"round(t.total)\"}."
        );
        // the expressions are part of what the fingerprint hashes
        assert_ne!(a.fingerprint(), b.fingerprint());
        let mut b = a.clone();
        b.items.push(Item {
            key: Key::Int(7),
            revision: 1,
            guards: Guards::default(),
        });
        assert_eq!(a.difference(&b).unwrap(), "Item 7 was not in the approval.");
        let mut b = a.clone();
        b.items[0].revision = 4;
        assert_eq!(
            a.difference(&b).unwrap(),
            "Item 1 was approved at revision 3 and is now given revision 4."
        );
        assert_eq!(a.difference(&a.clone()), None);
    }

    #[test]
    fn bad_lists_are_rejected() {
        let s = shape("int4");
        let cases = [
            (json!({"id": 1}), "items must be a JSON array"),
            (json!([1]), "item 1 is not a JSON object"),
            (json!([{"revision": 1}]), "item 1 has no key"),
            (json!([{"id": 1}]), "item 1 has no revision"),
            (
                json!([{"id": "1", "revision": 1}]),
                "item 1 has a key of the wrong type",
            ),
            (
                json!([{"id": 1.5, "revision": 1}]),
                "item 1 has a key of the wrong type",
            ),
            (
                json!([{"id": 3000000000i64, "revision": 1}]),
                "item 1 has a key out of range",
            ),
            (
                json!([{"id": 1, "revision": "3"}]),
                "item 1 has a revision of the wrong type",
            ),
            (
                json!([{"id": 1, "revision": 1, "qty": "two"}]),
                "item 1 has a value of the wrong type for column \"qty\"",
            ),
            (
                json!([{"id": 1, "revision": 1, "tenant": "x"}]),
                "item 1 names the tenant column \"tenant\"",
            ),
            (
                json!([{"id": 1, "revision": 1}, {"id": 1, "revision": 2}]),
                "items contain a duplicate key",
            ),
        ];
        for (items, message) in cases {
            let e = s.normalize(&items).unwrap_err();
            assert_eq!(e.message(), message, "{items}");
        }
        // an approval of nothing is no error: a job done at once
        assert_eq!(s.normalize(&json!([])).unwrap(), Vec::<Item>::new());
        let e = s
            .normalize(&json!([{"id": 1, "revision": 1, "nope": 1}]))
            .unwrap_err();
        assert_eq!(
            e,
            BatchError::UndefinedColumn {
                column: "nope".into(),
                named_by: Some("item 1".into()),
                default: None,
            }
        );
    }

    #[test]
    fn uuid_keys_normalize_to_postgres_text() {
        let s = shape("uuid");
        let items = s
            .normalize(&json!([
                {"id": "{A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11}", "revision": 1},
                {"id": "00000000000000000000000000000001", "revision": 1}
            ]))
            .unwrap();
        assert_eq!(items[0].key.text(), "00000000-0000-0000-0000-000000000001");
        assert_eq!(items[1].key.text(), "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11");
        assert!(s
            .normalize(&json!([{"id": "not-a-uuid", "revision": 1}]))
            .is_err());
    }

    #[test]
    fn text_keys_sort_by_bytes() {
        let items = shape("text")
            .normalize(&json!([{"id": "b", "revision": 1}, {"id": "B", "revision": 1}, {"id": "a", "revision": 1}]))
            .unwrap();
        let keys: Vec<String> = items.iter().map(|i| i.key.text()).collect();
        assert_eq!(keys, ["B", "a", "b"]);
    }

    #[test]
    fn key_and_revision_roles_are_checked() {
        // a key PostgreSQL orders, as it orders numerics
        let mut s = shape("numeric");
        assert_eq!(s.check_roles(), Ok(()));
        assert_eq!(s.key.order(&s.columns), Ok(KeyOrder::Sql));
        s = shape("int8");
        s.guard = Guard::Revision {
            column: "status".into(),
        };
        assert!(s.check_roles().is_err());
        s.guard = Guard::Revision {
            column: "missing".into(),
        };
        assert_eq!(
            s.check_roles(),
            Err(BatchError::UndefinedColumn {
                column: "missing".into(),
                named_by: None,
                default: None,
            })
        );
    }

    #[test]
    fn canonical_objects_sort_nested_keys() {
        let m = BTreeMap::from([
            ("b".to_string(), json!({"z": 1, "a": [1, {"y": 2, "x": 1}]})),
            ("a".to_string(), json!(null)),
        ]);
        assert_eq!(
            canonical_object(&m),
            "{\"a\": null, \"b\": {\"a\": [1, {\"x\": 1, \"y\": 2}], \"z\": 1}}"
        );
    }
}
