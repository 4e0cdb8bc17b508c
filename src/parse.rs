//! PostgreSQL's raw parser, for SQL a caller hands etc_batch as text (a step's command,
//! an items query, an expression to set a column to): what each statement is, read from the parse tree into plain Rust
//! values, so that the rules about them (src/chain/command.rs, src/job/register/items_query.rs)
//! never touch a node. The only module that reads parse trees.
//!
//! Parsing is syntax only: the objects a statement names need not exist, and nothing is
//! planned, locked or run.

use crate::txn::{self, Failure};
use pgrx::pg_sys;
use pgrx::PgList;
use std::ffi::{CStr, CString};

/// One statement of the text, as far as etc_batch asks about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Statement {
    pub kind: Kind,
    /// Where the statement begins in the text, in bytes, and how long it is (0: to the
    /// end of the text), as the parser reports them.
    pub location: i32,
    pub len: i32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind {
    /// A SELECT: `into` for SELECT INTO, `modifying_with` for a WITH clause that holds
    /// an INSERT, UPDATE, DELETE or MERGE.
    Select {
        into: bool,
        modifying_with: bool,
    },
    /// A CALL of a procedure, by its (possibly qualified) name.
    Call(Call),
    /// BEGIN, COMMIT, ROLLBACK, SAVEPOINT, PREPARE TRANSACTION and their kin.
    TransactionControl,
    Other,
}

/// A CALL: the procedure's name as written (`["etc_batch", "exec_batch_from_id"]`) and
/// its arguments.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    pub name: Vec<String>,
    pub args: Vec<CallArg>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallArg {
    /// `p_id => ...`: the argument's name; None for a positional argument.
    pub name: Option<String>,
    /// The argument's value when it is an integer literal.
    pub integer: Option<i64>,
}

/// The statements of `sql`, or the syntax error the parser raised (its message kept,
/// so that the caller can name what it was parsing). The parser reports a syntax error
/// with ereport; a subtransaction turns it into a value.
pub fn statements(sql: &str) -> Result<Vec<Statement>, Failure> {
    // text from SQL never holds a zero byte; callers say so in their own terms first
    let text = CString::new(sql).map_err(|_| {
        Failure::from(crate::error::BatchError::invalid(
            "the text contains a zero byte",
        ))
    })?;
    txn::subtransaction(|| {
        // SAFETY: raw_parser reads the NUL-terminated text and returns a List of RawStmt
        // allocated in the current memory context (the caller's: subtransaction
        // switches back to it), which is read here, before anything frees it. Every
        // node is checked for its tag before it is read as that kind of node.
        unsafe {
            let list = pg_sys::raw_parser(text.as_ptr(), pg_sys::RawParseMode::RAW_PARSE_DEFAULT);
            PgList::<pg_sys::RawStmt>::from_pg(list)
                .iter_ptr()
                .map(|raw| Statement {
                    kind: kind_of((*raw).stmt),
                    location: (*raw).stmt_location,
                    len: (*raw).stmt_len,
                })
                .collect()
        }
    })
}

/// What text meant as one SQL expression (set_expressions') is, parsed as the one value
/// of `SELECT (<text>)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expression {
    /// One expression, and nothing else.
    One,
    /// Text that closes the parenthesis and goes on: several statements, or a SELECT
    /// with more than one value (what `what` names).
    NotOne { what: &'static str },
}

/// What `text` is as one expression, or the syntax error the parser raised. The text
/// sits on lines of its own between the parentheses, so that a comment in it ends at
/// its own line.
pub fn expression(text: &str) -> Result<Expression, Failure> {
    let statements = format!("SELECT (\n{text}\n)");
    let sql = CString::new(statements).map_err(|_| {
        Failure::from(crate::error::BatchError::invalid(
            "the text contains a zero byte",
        ))
    })?;
    txn::subtransaction(|| {
        // SAFETY: as in statements; every node is checked for its tag before it is read
        // as that kind of node.
        unsafe {
            let list = pg_sys::raw_parser(sql.as_ptr(), pg_sys::RawParseMode::RAW_PARSE_DEFAULT);
            let raws = PgList::<pg_sys::RawStmt>::from_pg(list);
            if raws.len() != 1 {
                return Expression::NotOne {
                    what: "several statements",
                };
            }
            let stmt = (*raws.get_ptr(0).expect("one statement")).stmt;
            if !pgrx::is_a(stmt, pg_sys::NodeTag::T_SelectStmt) {
                return Expression::NotOne {
                    what: "another statement",
                };
            }
            let select = &*(stmt as *mut pg_sys::SelectStmt);
            let what = if select.op != pg_sys::SetOperation::SETOP_NONE {
                Some("a UNION, INTERSECT or EXCEPT")
            } else if PgList::<pg_sys::ResTarget>::from_pg(select.targetList).len() != 1 {
                Some("several values")
            } else if !select.fromClause.is_null() {
                Some("a FROM clause")
            } else if !select.whereClause.is_null() {
                Some("a WHERE clause")
            } else if !select.groupClause.is_null() || !select.havingClause.is_null() {
                Some("a GROUP BY or HAVING clause")
            } else if !select.windowClause.is_null() {
                Some("a WINDOW clause")
            } else if !select.sortClause.is_null()
                || !select.limitOffset.is_null()
                || !select.limitCount.is_null()
            {
                Some("an ORDER BY, LIMIT or OFFSET clause")
            } else if !select.distinctClause.is_null()
                || !select.intoClause.is_null()
                || !select.lockingClause.is_null()
                || !select.withClause.is_null()
                || !select.valuesLists.is_null()
            {
                Some("a clause of a SELECT")
            } else {
                let target = PgList::<pg_sys::ResTarget>::from_pg(select.targetList)
                    .get_ptr(0)
                    .expect("one value");
                (!(*target).name.is_null()).then_some("a value with a name")
            };
            match what {
                Some(what) => Expression::NotOne { what },
                None => Expression::One,
            }
        }
    })
}

/// What kind of statement a raw parse tree is.
///
/// # Safety
/// `stmt` is a node of a raw parse tree.
unsafe fn kind_of(stmt: *mut pg_sys::Node) -> Kind {
    if pgrx::is_a(stmt, pg_sys::NodeTag::T_TransactionStmt) {
        return Kind::TransactionControl;
    }
    if pgrx::is_a(stmt, pg_sys::NodeTag::T_CallStmt) {
        return Kind::Call(call_of(stmt as *mut pg_sys::CallStmt));
    }
    if !pgrx::is_a(stmt, pg_sys::NodeTag::T_SelectStmt) {
        return Kind::Other;
    }
    let select = stmt as *mut pg_sys::SelectStmt;
    // PostgreSQL allows a data-modifying WITH only at the top of a statement.
    let with = (*select).withClause;
    let modifying_with = !with.is_null()
        && PgList::<pg_sys::CommonTableExpr>::from_pg((*with).ctes)
            .iter_ptr()
            .any(|cte| !pgrx::is_a((*cte).ctequery, pg_sys::NodeTag::T_SelectStmt));
    Kind::Select {
        into: !(*select).intoClause.is_null(),
        modifying_with,
    }
}

/// A CALL's procedure name and arguments.
///
/// # Safety
/// `call` is a CallStmt of a raw parse tree, whose funccall is a FuncCall.
unsafe fn call_of(call: *mut pg_sys::CallStmt) -> Call {
    let func = (*call).funccall;
    let name = PgList::<pg_sys::Node>::from_pg((*func).funcname)
        .iter_ptr()
        .map(|n| string_node(n).unwrap_or_default())
        .collect();
    let args = PgList::<pg_sys::Node>::from_pg((*func).args)
        .iter_ptr()
        .map(|arg| {
            if pgrx::is_a(arg, pg_sys::NodeTag::T_NamedArgExpr) {
                let named = arg as *mut pg_sys::NamedArgExpr;
                CallArg {
                    name: Some(CStr::from_ptr((*named).name).to_string_lossy().into_owned()),
                    integer: integer_const((*named).arg as *mut pg_sys::Node),
                }
            } else {
                CallArg {
                    name: None,
                    integer: integer_const(arg),
                }
            }
        })
        .collect();
    Call { name, args }
}

/// The text of a String node.
///
/// # Safety
/// `node` is a node of a raw parse tree.
unsafe fn string_node(node: *mut pg_sys::Node) -> Option<String> {
    if !pgrx::is_a(node, pg_sys::NodeTag::T_String) {
        return None;
    }
    let sval = (*(node as *mut pg_sys::String)).sval;
    Some(CStr::from_ptr(sval).to_string_lossy().into_owned())
}

/// An integer literal's value (a bigint one is a Float node, its digits kept as text).
///
/// # Safety
/// `node` is a node of a raw parse tree.
unsafe fn integer_const(node: *mut pg_sys::Node) -> Option<i64> {
    if !pgrx::is_a(node, pg_sys::NodeTag::T_A_Const) {
        return None;
    }
    let constant = node as *mut pg_sys::A_Const;
    if (*constant).isnull {
        return None;
    }
    let value = &(*constant).val;
    match value.node.type_ {
        pg_sys::NodeTag::T_Integer => Some(value.ival.ival as i64),
        pg_sys::NodeTag::T_Float => CStr::from_ptr(value.fval.fval).to_str().ok()?.parse().ok(),
        _ => None,
    }
}

#[cfg(any(test, feature = "pg_test"))]
#[pgrx::pg_schema]
mod tests {
    use super::*;
    use pgrx::prelude::*;

    #[pg_test]
    fn statements_are_read_into_plain_values() {
        let parsed = statements("SELECT 1; CALL s.p(7, x => 9000000000); COMMIT").unwrap();
        assert_eq!(parsed.len(), 3);
        assert_eq!(
            parsed[0].kind,
            Kind::Select {
                into: false,
                modifying_with: false
            }
        );
        let Kind::Call(call) = &parsed[1].kind else {
            panic!("{:?}", parsed[1]);
        };
        assert_eq!(call.name, vec!["s".to_string(), "p".to_string()]);
        assert_eq!(
            call.args,
            vec![
                CallArg {
                    name: None,
                    integer: Some(7)
                },
                CallArg {
                    name: Some("x".into()),
                    integer: Some(9_000_000_000)
                },
            ]
        );
        assert_eq!(parsed[2].kind, Kind::TransactionControl);
        assert_eq!(
            statements("WITH d AS (DELETE FROM t RETURNING *) SELECT * INTO u FROM d").unwrap()[0]
                .kind,
            Kind::Select {
                into: true,
                modifying_with: true
            }
        );
        assert!(statements("SELEC 1").is_err());
    }

    #[pg_test]
    fn one_expression_is_told_from_text_that_closes_its_parenthesis() {
        assert_eq!(
            expression("round(total * 100)::bigint").unwrap(),
            Expression::One
        );
        // a comment ends at its own line, and cannot swallow the closing parenthesis
        assert_eq!(expression("lower(email) -- note").unwrap(), Expression::One);
        for (text, what) in [
            ("1); DROP TABLE t; SELECT (1", "several statements"),
            ("1), (2", "several values"),
            ("x) FROM other WHERE (true", "a FROM clause"),
            ("1) WHERE (true", "a WHERE clause"),
            ("1) UNION SELECT (2", "a UNION, INTERSECT or EXCEPT"),
            ("1) ORDER BY (1", "an ORDER BY, LIMIT or OFFSET clause"),
            ("1) AS x, (2", "several values"),
        ] {
            assert_eq!(
                expression(text).unwrap(),
                Expression::NotOne { what },
                "{text}"
            );
        }
        assert!(expression("lower(").is_err());
        assert!(expression("1 /* unclosed").is_err());
    }
}
