"""Security of etc_batch: objects planted on a caller's search_path, identifiers and
names made of quotes, semicolons, comments and unicode, and privileges as the catalog
records them.

1. Look-alikes. A role without privileges of note owns a schema `evil` and fills it
   with operators, functions, aggregates, types and relations named like those
   etc_batch uses; each one records its use, as a row and as a WARNING (which reaches
   the client even when the transaction that used it rolls back). A caller puts `evil`
   first on its search_path, before pg_catalog, proves that every look-alike now
   shadows the real object for its own SQL, and then uses the whole API: every result
   must be right and no look-alike may have run. Once as a superuser, once as the
   hostile role itself granted the API: etc_batch does its bookkeeping as the
   extension's owner, so a look-alike it picked up would run as a superuser.
2. Odd identifiers. A target table, its schema and its columns (key, tenant, revision,
   guards, values to set) named with quotes, semicolons, comments, backslashes, commas
   and unicode, items whose JSON keys are those names, a handler with such a name; and
   batch, job, lease and holder names of the same characters, which must come back
   exactly wherever etc_batch shows them.
3. Privileges, read from the catalog and tried by roles that were granted nothing.
"""

import json
import secrets
import time
from collections import Counter
from datetime import timedelta

import psycopg
import pytest
from psycopg import errors, sql
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

MARK = "etc_batch look-alike used:"
SEARCH_PATH = "SET search_path = evil, public, pg_catalog"


def ident(*names):
    return sql.Identifier(*names)


def lit(value):
    return sql.Literal(value).as_string(None)


def utf8_order(keys):
    """Text keys in the order etc_batch freezes them: by their bytes."""
    return sorted(keys, key=lambda k: k.encode("utf-8"))


def quote_literal(db, value):
    return db.admin.execute("SELECT quote_literal(%s::text) AS q", (value,)).fetchone()["q"]


def documented_lock_key(db, namespace, key):
    """lock_key as docs/leases-and-locks.md defines it."""
    return db.admin.execute(
        "SELECT hashtextextended(octet_length(%s::text)::text || ':' || %s::text || %s::text, 0)"
        " AS k", (namespace, namespace, key)).fetchone()["k"]


# 1. look-alikes -----------------------------------------------------------------------------

# A value of each type, written so that nothing in it is looked up on the search path.
SAMPLE = {
    "text": "'a'::pg_catalog.text",
    "int8": "1::pg_catalog.int8",
    "int4": "1::pg_catalog.int4",
    "int2": "1::pg_catalog.int2",
    "numeric": "1::pg_catalog.numeric",
    "float8": "1::pg_catalog.float8",
    "bool": "true",
    "jsonb": "'{\"a\": [1]}'::pg_catalog.jsonb",
    "timestamptz": "'2020-01-01 00:00+00'::pg_catalog.timestamptz",
    "interval": "'1 second'::pg_catalog.interval",
    "oid": "1::pg_catalog.oid",
    "name": "'a'::pg_catalog.name",
    '"char"': "'a'::pg_catalog.\"char\"",
    "xid8": "'1'::pg_catalog.xid8",
    "bytea": "'\\x00'::pg_catalog.bytea",
    "regclass": "'pg_catalog.pg_class'::pg_catalog.regclass",
    "text[]": "ARRAY['a']::pg_catalog.text[]",
    "int8[]": "ARRAY[1]::pg_catalog.int8[]",
    "int2[]": "ARRAY[1]::pg_catalog.int2[]",
    "jsonb[]": "ARRAY['{}']::pg_catalog.jsonb[]",
    "bool[]": "ARRAY[true]",
    # polymorphic parameters: a type no exact look-alike takes
    "anyelement": "1::pg_catalog.numeric",
    "anynonarray": "1::pg_catalog.numeric",
    "anycompatible": "1::pg_catalog.numeric",
    "anyarray": "ARRAY[1::pg_catalog.numeric]",
    "anycompatiblearray": "ARRAY[1::pg_catalog.numeric]",
}

COMPARABLE = ["text", "int8", "int4", "int2", "numeric", "float8", "bool", "timestamptz",
           "interval", "oid", "name", '"char"', "jsonb", "xid8"]
INTEGERS = ["int8", "int4", "int2"]


def operator_specs():
    """(operator, left type or None for a prefix operator, right type, result type)."""
    specs = []
    comparisons = ["=", "<>", "<", ">", "<=", ">="]
    for t in COMPARABLE:
        specs += [(op, t, t, "bool") for op in comparisons]
    for a in INTEGERS:
        for b in INTEGERS:
            if a != b:
                specs += [(op, a, b, "bool") for op in comparisons]
    specs += [(op, a, b, "bool") for op in comparisons for a, b in (("name", "text"),
                                                                     ("text", "name"))]
    arithmetic = {("int8", "int4"): "int8", ("int4", "int8"): "int8", ("int8", "int8"): "int8",
             ("int4", "int4"): "int4", ("int2", "int2"): "int2", ("numeric", "numeric"): "numeric",
             ("float8", "float8"): "float8"}
    for (a, b), result in arithmetic.items():
        specs += [(op, a, b, result) for op in ("+", "-", "*", "/")]
    specs += [("%", t, t, t) for t in ("int8", "int4", "int2", "numeric")]
    specs += [("-", None, t, t) for t in ("int8", "int4", "numeric", "interval")]
    specs += [
        ("+", "timestamptz", "interval", "timestamptz"),
        ("+", "interval", "timestamptz", "timestamptz"),
        ("-", "timestamptz", "interval", "timestamptz"),
        ("-", "timestamptz", "timestamptz", "interval"),
        ("+", "interval", "interval", "interval"),
        ("-", "interval", "interval", "interval"),
        ("*", "interval", "float8", "interval"),
        ("*", "float8", "interval", "interval"),
        ("/", "interval", "float8", "interval"),
        ("<<", "int8", "int4", "int8"),
        (">>", "int8", "int4", "int8"),
        ("|", "int8", "int8", "int8"),
        ("&", "int8", "int8", "int8"),
        ("#", "int8", "int8", "int8"),
        ("|", "int4", "int4", "int4"),
        ("&", "int4", "int4", "int4"),
        ("||", "text", "text", "text"),
        ("||", "text", "anynonarray", "text"),
        ("||", "anynonarray", "text", "text"),
        ("~", "text", "text", "bool"),
        ("!~", "text", "text", "bool"),
        ("~~", "text", "text", "bool"),
        ("!~~", "text", "text", "bool"),
        ("~~*", "text", "text", "bool"),
        ("->", "jsonb", "text", "jsonb"),
        ("->", "jsonb", "int4", "jsonb"),
        ("->>", "jsonb", "text", "text"),
        ("->>", "jsonb", "int4", "text"),
        ("#>", "jsonb", "text[]", "jsonb"),
        ("#>>", "jsonb", "text[]", "text"),
        ("@>", "jsonb", "jsonb", "bool"),
        ("<@", "jsonb", "jsonb", "bool"),
        ("?", "jsonb", "text", "bool"),
        ("?|", "jsonb", "text[]", "bool"),
        ("?&", "jsonb", "text[]", "bool"),
        ("||", "jsonb", "jsonb", "jsonb"),
        ("-", "jsonb", "text", "jsonb"),
        ("-", "jsonb", "int4", "jsonb"),
        ("#-", "jsonb", "text[]", "jsonb"),
        ("=", "anyarray", "anyarray", "bool"),
        ("<>", "anyarray", "anyarray", "bool"),
        ("@>", "anyarray", "anyarray", "bool"),
        ("<@", "anyarray", "anyarray", "bool"),
        ("&&", "anyarray", "anyarray", "bool"),
        ("||", "anycompatiblearray", "anycompatiblearray", "anycompatiblearray"),
        ("||", "anycompatiblearray", "anycompatible", "anycompatiblearray"),
        ("||", "anycompatible", "anycompatiblearray", "anycompatiblearray"),
    ]
    return specs


def function_specs():
    """(name, argument types, result type, what the real one computes, set-returning)."""
    f = []

    def add(name, args, result, expr=None, setof=False):
        call = f"pg_catalog.{name}({', '.join(f'${i + 1}' for i in range(len(args)))})"
        f.append((name, args, result, expr or call, setof))

    for name, result in [("now", "timestamptz"), ("clock_timestamp", "timestamptz"),
                         ("statement_timestamp", "timestamptz"),
                         ("transaction_timestamp", "timestamptz"), ("timeofday", "text"),
                         ("pg_backend_pid", "int4"), ("txid_current", "int8"),
                         ("txid_current_if_assigned", "int8"), ("pg_current_xact_id", "xid8"),
                         ("current_database", "name"), ("current_schema", "name"),
                         ("version", "text"), ("jsonb_build_object", "jsonb"),
                         ("jsonb_build_array", "jsonb")]:
        add(name, [], result)
    add("hashtext", ["text"], "int4")
    add("hashtextextended", ["text", "int8"], "int8")
    add("hashint8", ["int8"], "int4")
    add("pg_advisory_xact_lock", ["int8"], "void")
    add("pg_advisory_xact_lock", ["int4", "int4"], "void")
    add("pg_advisory_xact_lock_shared", ["int8"], "void")
    add("pg_try_advisory_xact_lock", ["int8"], "bool")
    add("pg_try_advisory_xact_lock", ["int4", "int4"], "bool")
    add("pg_advisory_lock", ["int8"], "void", "pg_catalog.pg_advisory_xact_lock($1)")
    add("pg_try_advisory_lock", ["int8"], "bool", "pg_catalog.pg_try_advisory_xact_lock($1)")
    add("pg_advisory_unlock", ["int8"], "bool", "false")
    for name in ("lower", "upper", "md5", "quote_ident", "quote_literal", "quote_nullable"):
        add(name, ["text"], "text")
    add("quote_literal", ["anyelement"], "text")
    add("length", ["text"], "int4")
    add("octet_length", ["text"], "int4")
    add("substr", ["text", "int4", "int4"], "text")
    add("left", ["text", "int4"], "text")
    add("replace", ["text", "text", "text"], "text")
    add("split_part", ["text", "text", "int4"], "text")
    add("strpos", ["text", "text"], "int4")
    add("regexp_replace", ["text", "text", "text"], "text")
    add("string_to_array", ["text", "text"], "text[]")
    add("encode", ["bytea", "text"], "text")
    add("sha256", ["bytea"], "bytea")
    for args in (["text"], ["text", "text"], ["text", "int8"], ["text", "int4"],
                 ["text", "text", "text"], ["text", "int8", "text"]):
        add("format", args, "text")
    add("to_jsonb", ["anyelement"], "jsonb")
    add("to_json", ["anyelement"], "json")
    add("jsonb_typeof", ["jsonb"], "text")
    add("jsonb_array_length", ["jsonb"], "int4", "0")
    add("jsonb_strip_nulls", ["jsonb"], "jsonb")
    add("jsonb_object_keys", ["jsonb"], "text", setof=True)
    add("jsonb_array_elements", ["jsonb"], "jsonb", "pg_catalog.jsonb_build_array($1)", setof=True)
    for args in (["text", "text"], ["text", "int8"], ["text", "int4"], ["text", "jsonb"],
                 ["text", "text", "text", "text"],
                 ["text", "int4", "text", "int8", "text", "text"],
                 ["text", "int8", "text", "int8", "text", "text"],
                 ["text", "text", "text", "int8", "text", "text"],
                 ["text", "text", "text", "text", "text", "jsonb"]):
        add("jsonb_build_object", args, "jsonb")
    add("jsonb_build_array", ["jsonb"], "jsonb")
    add("jsonb_build_array", ["text"], "jsonb")
    add("cardinality", ["anyarray"], "int4")
    add("array_length", ["anyarray", "int4"], "int4")
    add("array_upper", ["anyarray", "int4"], "int4")
    add("array_to_string", ["anyarray", "text"], "text")
    add("array_append", ["anycompatiblearray", "anycompatible"], "anycompatiblearray")
    add("unnest", ["anyarray"], "anyelement", setof=True)
    for t in ("text", "int8", "int2", "jsonb", "bool"):
        add("unnest", [f"{t}[]"], t, setof=True)
    add("generate_series", ["int4", "int4"], "int4", setof=True)
    add("generate_series", ["int8", "int8"], "int8", setof=True)
    add("round", ["numeric", "int4"], "numeric")
    add("round", ["numeric"], "numeric")
    add("round", ["float8"], "float8")
    add("abs", ["int8"], "int8")
    add("abs", ["int4"], "int4")
    add("date_part", ["text", "interval"], "float8")
    add("date_part", ["text", "timestamptz"], "float8")
    add("date_trunc", ["text", "interval"], "interval")
    add("date_trunc", ["text", "timestamptz"], "timestamptz")
    add("to_char", ["timestamptz", "text"], "text")
    add("age", ["timestamptz"], "interval")
    add("justify_interval", ["interval"], "interval")
    add("current_setting", ["text"], "text")
    add("current_setting", ["text", "bool"], "text")
    add("set_config", ["text", "text", "bool"], "text")
    add("has_table_privilege", ["oid", "text"], "bool")
    add("has_table_privilege", ["text", "text"], "bool")
    add("has_table_privilege", ["name", "oid", "text"], "bool")
    add("has_function_privilege", ["oid", "text"], "bool")
    add("has_function_privilege", ["text", "oid", "text"], "bool")
    add("has_schema_privilege", ["text", "text"], "bool")
    add("pg_get_userbyid", ["oid"], "name")
    add("nextval", ["regclass"], "int8", "0")
    add("pg_notify", ["text", "text"], "void")
    return f


def aggregate_specs():
    """(name, argument types, state type, step over the state $1 and the arguments $2...,
    initial state or None)."""
    a = []
    a.append(("count", [], "int8", "$1 OPERATOR(pg_catalog.+) 1", "0"))
    for t in ("text", "int8", "int4", "int2", "jsonb", "bool"):
        a.append(("count", [t], "int8",
                  "$1 OPERATOR(pg_catalog.+) CASE WHEN $2 IS NULL THEN 0 ELSE 1 END", "0"))
    for name, op in (("max", ">"), ("min", "<")):
        for t in ("int8", "int4", "int2", "text", "timestamptz", "numeric", "interval", "oid"):
            a.append((name, [t], t,
                      f"CASE WHEN $2 IS NULL THEN $1 WHEN $1 IS NULL "
                      f"OR $2 OPERATOR(pg_catalog.{op}) $1 THEN $2 ELSE $1 END", None))
    a.append(("sum", ["int4"], "int8",
              "CASE WHEN $2 IS NULL THEN $1 ELSE COALESCE($1, 0) OPERATOR(pg_catalog.+) $2 END",
              None))
    a.append(("sum", ["int8"], "numeric",
              "CASE WHEN $2 IS NULL THEN $1 ELSE COALESCE($1, 0) OPERATOR(pg_catalog.+) $2 END",
              None))
    a.append(("array_agg", ["anynonarray"], "anyarray", "pg_catalog.array_append($1, $2)", None))
    for t in ("text", "int8", "jsonb", "bool", "int4"):
        a.append(("array_agg", [t], f"{t}[]", "pg_catalog.array_append($1, $2)", None))
    a.append(("jsonb_agg", ["anyelement"], "jsonb",
              "COALESCE($1, '[]'::pg_catalog.jsonb) OPERATOR(pg_catalog.||) "
              "pg_catalog.jsonb_build_array(pg_catalog.to_jsonb($2))", None))
    a.append(("jsonb_object_agg", ["text", "jsonb"], "jsonb",
              "COALESCE($1, '{}'::pg_catalog.jsonb) OPERATOR(pg_catalog.||) "
              "pg_catalog.jsonb_build_object($2, $3)", None))
    a.append(("string_agg", ["text", "text"], "text",
              "CASE WHEN $2 IS NULL THEN $1 WHEN $1 IS NULL THEN $2 "
              "ELSE $1 OPERATOR(pg_catalog.||) $3 OPERATOR(pg_catalog.||) $2 END", None))
    for name, op in (("bool_or", "OR"), ("bool_and", "AND"), ("every", "AND")):
        a.append((name, ["bool"], "bool",
                  f"CASE WHEN $2 IS NULL THEN $1 WHEN $1 IS NULL THEN $2 ELSE $1 {op} $2 END",
                  None))
    return a


# type -> a literal of it, cast by the type's bare name (so the look-alike is what resolves)
TYPE_PROBES = {
    "text": "'a'", "int2": "'1'", "int4": "'1'", "int8": "'1'", "jsonb": "'{}'",
    "json": "'{}'", "oid": "'1'", "bool": "'t'", "timestamptz": "'2020-01-01'",
    "name": "'a'", "regclass": "'pg_catalog.pg_class'", "regrole": "'pg_monitor'",
    "regprocedure": "'pg_catalog.now()'", "regnamespace": "'pg_catalog'",
    "regtype": "'pg_catalog.int4'", '"char"': "'a'", "xid8": "'1'", "date": "'2020-01-01'",
    "float8": "'1'", "uuid": "'00000000-0000-0000-0000-000000000000'",
    "bytea": "'\\x00'",
}

ETC_BATCH_RELATIONS = ["batch_log", "step_audit", "job", "job_item", "job_item_chunk", "job_audit",
                       "job_audit_chunk",
                       "job_audit_items",
                       "lease", "leases", "locks", "job_progress", "chain_progress"]
CATALOG_RELATIONS = ["pg_locks", "pg_stat_activity", "pg_class", "pg_proc", "pg_namespace",
                     "pg_attribute", "pg_index", "pg_type", "pg_roles", "pg_extension",
                     "pg_settings", "pg_file_settings", "pg_constraint", "pg_trigger",
                     "pg_database", "pg_db_role_setting", "pg_available_extensions", "pg_depend"]


class LookAlikes:
    """Schema `evil`, owned by `role`, full of look-alikes that record their use in
    evil.capture_log and with a WARNING starting with MARK. `probes` maps a label to a
    statement that, run under a search_path with evil first, uses that look-alike."""

    def __init__(self, db, role):
        self.db = db
        self.role = role
        self.probes = {}
        self.relations = {}
        self._n = 0
        db.admin.execute(sql.SQL("CREATE SCHEMA evil AUTHORIZATION {}").format(ident(role)))
        # the column lists of the real relations, for look-alikes a statement would accept
        for rel in [f"etc_batch.{r}" for r in ETC_BATCH_RELATIONS] + [
                f"pg_catalog.{r}" for r in CATALOG_RELATIONS]:
            # a view cannot have a column of a pseudo-type (pg_attribute.attmissingval)
            self.relations[rel.split(".")[1]] = [
                (r["attname"], "text[]" if r["type"] == "anyarray" else r["type"])
                for r in db.admin.execute(
                    """SELECT a.attname,
                              format_type(CASE WHEN t.typtype = 'd' THEN t.typbasetype
                                               ELSE a.atttypid END, a.atttypmod) AS type
                         FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid
                        WHERE a.attrelid = %s::regclass AND a.attnum > 0
                          AND NOT a.attisdropped ORDER BY a.attnum""", (rel,)).fetchall()]
        self.conn = db.connect()
        self.conn.execute(sql.SQL("SET ROLE {}").format(ident(role)))
        self.conn.execute("SET search_path = pg_catalog, pg_temp")
        assert not self.conn.execute(
            "SELECT rolsuper FROM pg_roles WHERE rolname = current_user").fetchone()[0]
        self._plant()

    def _ddl(self, statement):
        self.conn.execute(statement)

    def _name(self):
        self._n += 1
        return f"la_{self._n}"

    def _function(self, name, args, result, expr, label, setof=False):
        if result == "void":
            tail = f"PERFORM {expr}; RETURN;"
        elif setof:
            tail = f"RETURN QUERY SELECT {expr};"
        else:
            tail = f"RETURN {expr};"
        returns = f"SETOF {result}" if setof else result
        self._ddl(
            f"CREATE FUNCTION evil.{name}({', '.join(args)}) RETURNS {returns} "
            f"LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $la$ BEGIN "
            f"PERFORM evil.captured({lit(label)}, current_user); {tail} END $la$")

    def _plant(self):
        self._ddl("""CREATE TABLE evil.capture_log (
                         seq bigint GENERATED ALWAYS AS IDENTITY,
                         what text NOT NULL,
                         as_role name NOT NULL)""")
        # SECURITY DEFINER, so that whoever a look-alike runs as can record its use
        self._ddl(f"""CREATE FUNCTION evil.captured(p_what text, p_as name) RETURNS boolean
                      LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
                      AS $la$ BEGIN
                        INSERT INTO evil.capture_log (what, as_role) VALUES (p_what, p_as);
                        RAISE WARNING '{MARK} % (as %)', p_what, p_as;
                        RETURN true;
                      END $la$""")
        self._ddl("GRANT USAGE ON SCHEMA evil TO PUBLIC")

        for op, left, right, result in operator_specs():
            label = f"operator {op}({left or ''},{right})"
            fn = self._name()
            args = [left, right] if left else [right]
            expr = (f"$1 OPERATOR(pg_catalog.{op}) $2" if left
                    else f"OPERATOR(pg_catalog.{op}) $1")
            self._function(fn, args, result, expr, label)
            leftarg = f"LEFTARG = {left}, " if left else ""
            self._ddl(f"CREATE OPERATOR evil.{op} ({leftarg}RIGHTARG = {right}, "
                      f"FUNCTION = evil.{fn})")
            self.probes[label] = (f"SELECT {SAMPLE[left]} {op} {SAMPLE[right]}" if left
                                  else f"SELECT {op} {SAMPLE[right]}")

        for name, args, result, expr, setof in function_specs():
            label = f"function {name}({','.join(args)})"
            self._function(name, args, result, expr, label, setof)
            call = f"{name}({', '.join(SAMPLE[a] for a in args)})"
            self.probes[label] = f"SELECT * FROM {call}" if setof else f"SELECT {call}"

        for name, args, state, step, init in aggregate_specs():
            label = f"aggregate {name}({','.join(args) or '*'})"
            step_fn, final_fn = self._name(), self._name()
            self._function(step_fn, [state] + args, state, step, label)
            # the final function runs once per group, even over no rows at all
            self._function(final_fn, [state], state, "$1", label)
            initcond = f", INITCOND = {lit(init)}" if init is not None else ""
            self._ddl(f"CREATE AGGREGATE evil.{name}({', '.join(args) or '*'}) "
                      f"(SFUNC = evil.{step_fn}, STYPE = {state}, "
                      f"FINALFUNC = evil.{final_fn}{initcond})")
            columns = ", ".join(f"c{i}" for i in range(len(args)))
            values = ", ".join(SAMPLE[a] for a in args)
            self.probes[label] = (
                f"SELECT {name}({columns}) FROM (VALUES ({values})) v({columns})" if args
                else f"SELECT {name}(*) FROM (VALUES (1)) v(c0)")

        for t, value in TYPE_PROBES.items():
            label = f"type {t}"
            self._ddl(f"CREATE DOMAIN evil.{t} AS pg_catalog.{t} "
                      f"CHECK (evil.captured({lit(label)}, current_user))")
            self.probes[label] = f"SELECT {value}::{t}"

        self._ddl("""CREATE FUNCTION evil.instead() RETURNS trigger LANGUAGE plpgsql
                     SET search_path = pg_catalog, pg_temp AS $la$ BEGIN
                       PERFORM evil.captured('relation ' || TG_TABLE_NAME, current_user);
                       IF TG_OP = 'DELETE' THEN RETURN OLD; END IF;
                       RETURN NEW;
                     END $la$""")
        for rel, columns in self.relations.items():
            label = f"relation {rel}"
            select = sql.SQL(", ").join(
                sql.SQL("NULL::{} AS {}").format(sql.SQL(t), ident(c)) for c, t in columns)
            self._ddl(sql.SQL("CREATE VIEW evil.{} AS SELECT {} "
                              "WHERE evil.captured({}, current_user)")
                      .format(ident(rel), select, sql.Literal(label)))
            self._ddl(sql.SQL("CREATE TRIGGER instead INSTEAD OF INSERT OR UPDATE OR DELETE ON "
                              "evil.{} FOR EACH ROW EXECUTE FUNCTION evil.instead()")
                      .format(ident(rel)))
            self.probes[label] = f"SELECT * FROM {rel}"
            self.probes[f"{label} (insert)"] = (
                sql.SQL("INSERT INTO {} ({}) VALUES (NULL)")
                .format(ident(rel), ident(columns[0][0])).as_string(None))

    def plant_temporary(self, conn):
        """The same relations and types in the temporary schema of conn's session, which
        PostgreSQL searches for relations and types before anything on the path."""
        for rel in self.relations:
            conn.execute(sql.SQL("CREATE TEMPORARY VIEW {} AS SELECT * FROM evil.{}")
                         .format(ident(rel), ident(rel)))
        for t in TYPE_PROBES:
            conn.execute(f"CREATE DOMAIN pg_temp.{t} AS pg_catalog.{t} "
                         f"CHECK (evil.captured({lit('temporary type ' + t)}, current_user))")

    def log(self):
        return [(r["what"], r["as_role"]) for r in self.db.admin.execute(
            "SELECT what, as_role::text AS as_role FROM evil.capture_log ORDER BY seq")]

    def clear(self):
        self.db.admin.execute("TRUNCATE evil.capture_log")


class Caller:
    """A session whose search_path puts evil first; keeps look-alike warnings apart
    from etc_batch's own notices."""

    def __init__(self, db, role=None):
        self.db = db
        self.conn = db.connect()
        self.pid = self.conn.info.backend_pid
        self.captures = []
        self.notices = []
        self.statement = None
        self.conn.add_notice_handler(self._keep)
        if role is not None:
            self.conn.execute(sql.SQL("SET ROLE {}").format(ident(role)))
        self.conn.execute(SEARCH_PATH)

    def _keep(self, diag):
        text = diag.message_primary or ""
        if text.startswith(MARK):
            # which statement of this session it happened in, for the failure message
            self.captures.append(f"{text} <- {self.statement}")
        else:
            self.notices.append(text)

    def _execute(self, statement, params, row_factory=None):
        self.statement = statement
        cursor = self.conn.cursor(row_factory=row_factory) if row_factory else self.conn.cursor()
        return cursor.execute(statement, params)

    def rows(self, statement, params=None):
        return self._execute(statement, params, dict_row).fetchall()

    def row(self, statement, params=None):
        return self._execute(statement, params, dict_row).fetchone()

    def value(self, statement, params=None):
        return self._execute(statement, params).fetchone()[0]

    def where(self, relation, column, value, columns="*"):
        """Rows of an etc_batch view where column = value, with the operator spelled out:
        this session's own bare = is a look-alike."""
        return self.rows(f"SELECT {columns} FROM etc_batch.{relation} "
                         f"WHERE {column} OPERATOR(pg_catalog.=) %s", (value,))

    def run(self, statement, params=None):
        self.notices.clear()
        self._execute(statement, params)
        return list(self.notices)

    def probe(self, look):
        """Every look-alike is what this session's own unqualified SQL resolves to. A
        look-alike records its use before it computes anything, so a probe whose real
        counterpart then fails on the sample value still counts."""
        missed = []
        for label, statement in look.probes.items():
            before = len(self.captures)
            failure = ""
            try:
                self._execute(statement, None)
            except psycopg.Error as e:
                failure = f" ({e.sqlstate}: {e})"
            if len(self.captures) == before:
                missed.append(f"{label}: {statement}{failure}")
        assert missed == [], "look-alikes this session does not resolve to:\n" + "\n".join(missed)
        self.captures.clear()
        look.clear()


class World:
    """What the API works on in the look-alike test: a table the steps write, a gate a
    step fails on until it is opened, orders for jobs, and a handler."""

    def __init__(self, db, tag):
        self.db = db
        self.effect = f"sec_effect_{tag}"
        self.gate = f"sec_gate_{tag}"
        self.orders = f"sec_orders_{tag}"
        self.handler = f"sec_handler_{tag}"
        a = db.admin
        a.execute(sql.SQL("CREATE TABLE public.{} (batch text NOT NULL, step int NOT NULL)")
                  .format(ident(self.effect)))
        a.execute(sql.SQL("CREATE TABLE public.{} (v int CONSTRAINT shut CHECK (v > 1))")
                  .format(ident(self.gate)))
        # with a deferrable constraint in the database, the runner checks deferred
        # constraints inside every step
        a.execute(sql.SQL("CREATE TABLE public.{} (v int UNIQUE DEFERRABLE INITIALLY DEFERRED)")
                  .format(ident(f"sec_deferred_{tag}")))
        a.execute(sql.SQL(
            """CREATE TABLE public.{} (tenant text, id int, revision int NOT NULL, qty int,
                                       status text NOT NULL, due date, PRIMARY KEY (tenant, id))""")
                  .format(ident(self.orders)))
        with a.cursor() as cur:
            cur.executemany(
                sql.SQL("INSERT INTO public.{} VALUES (%s, %s, %s, %s, 'pending', %s)")
                .format(ident(self.orders)),
                [(t, i, 1 + i % 3, i % 5, f"2030-01-{i:02d}") for t in "AB" for i in range(1, 13)])
        # the registrant's own code: it pins its search_path, as code run on another's
        # behalf must
        a.execute(sql.SQL(
            """CREATE FUNCTION public.{fn}(item jsonb) RETURNS jsonb LANGUAGE plpgsql
               SET search_path = pg_catalog, pg_temp AS $$
               DECLARE r jsonb;
               BEGIN
                 UPDATE public.{t} AS o SET status = 'handled', revision = o.revision + 1
                  WHERE o.tenant = item ->> 'tenant' AND o.id = (item ->> 'id')::int
                    AND o.revision = (item ->> 'revision')::int
                 RETURNING to_jsonb(o) INTO r;
                 RETURN r;
               END $$""").format(fn=ident(self.handler), t=ident(self.orders)))
        self.initial = self.snapshot()

    def grant(self, role):
        r = ident(role)
        a = self.db.admin
        a.execute(sql.SQL("GRANT USAGE ON SCHEMA etc_batch TO {}").format(r))
        a.execute(sql.SQL("GRANT EXECUTE ON ALL ROUTINES IN SCHEMA etc_batch TO {}").format(r))
        a.execute(sql.SQL("GRANT SELECT ON ALL TABLES IN SCHEMA etc_batch TO {}").format(r))
        a.execute(sql.SQL("GRANT INSERT ON public.{}, public.{} TO {}")
                  .format(ident(self.effect), ident(self.gate), r))
        a.execute(sql.SQL("GRANT SELECT, UPDATE ON public.{} TO {}").format(ident(self.orders), r))

    def snapshot(self):
        rows = self.db.admin.execute(
            sql.SQL("SELECT tenant, id, revision, qty, status, due FROM public.{}")
            .format(ident(self.orders))).fetchall()
        return {(r["tenant"], r["id"]): (r["revision"], r["qty"], r["status"], r["due"])
                for r in rows}

    def items(self, tenant, ids):
        out = []
        for i in ids:
            revision, qty, _, due = self.initial[(tenant, i)]
            out.append({"id": i, "revision": revision, "qty": qty, "due": str(due)})
        return out

    def effects(self, batch):
        rows = self.db.admin.execute(
            sql.SQL("SELECT step FROM public.{} WHERE batch = %s").format(ident(self.effect)),
            (batch,)).fetchall()
        return Counter(r["step"] for r in rows)

    def expected_rows(self, changes):
        """The table as it must be: the initial rows with `changes` (tenant, id) -> status
        applied, each with its revision one higher."""
        want = dict(self.initial)
        for row, status in changes.items():
            revision, qty, _, due = self.initial[row]
            want[row] = (revision + 1, qty, status, due)
        return want


def job_state(db, job):
    return db.admin.execute(
        "SELECT status, next_index, problem, status_reason FROM etc_batch.job WHERE job_id = %s",
        (job,)).fetchone()


def audit_keys(db, job):
    return [r["item_key"] for r in db.admin.execute(
        "SELECT item_key FROM etc_batch.job_audit_items WHERE job_id = %s ORDER BY position", (job,))]


def register_sql(handler=False):
    # casts qualified: in the look-alike test the caller's own bare type names are
    # look-alikes too
    return ("SELECT * FROM etc_batch.register_job(job_id => %s, tenant => %s, "
            "target => %s::pg_catalog.regclass, items => %s, chunk_size => %s, "
            + ("set_values => NULL, handler => %s::pg_catalog.regprocedure)" if handler
               else "set_values => %s, expect => %s)"))


@pytest.mark.parametrize("caller_kind", ["superuser", "hostile_role"])
def test_look_alikes_on_the_search_path_change_nothing(db, roles, caller_kind):
    mallory = roles("mallory")
    look = LookAlikes(db, mallory)
    tag = secrets.token_hex(3)
    world = World(db, tag)
    hostile = caller_kind == "hostile_role"
    if hostile:
        world.grant(mallory)
    me = mallory if hostile else db.admin.execute("SELECT current_user AS u").fetchone()["u"]
    caller = Caller(db, mallory if hostile else None)
    if hostile:
        look.plant_temporary(caller.conn)
    caller.probe(look)
    admin = db.admin

    # chains ------------------------------------------------------------------------------
    batch = f"sec chain {tag}"

    # A step's command is its author's SQL and runs under the caller's search_path, so
    # these name nothing a look-alike could stand for.
    def step(n):
        return f"INSERT INTO public.{world.effect} (batch, step) VALUES ({lit(batch)}, {n})"

    s1 = caller.value("SELECT etc_batch.add_step(%s, %s)", (batch, step(1)))
    s2 = caller.value("SELECT etc_batch.add_step(%s, %s)", (batch, step(2)))
    shut = f"INSERT INTO public.{world.gate} (v) VALUES (1); {step(3)}"
    s3 = caller.value("SELECT etc_batch.add_step(%s, %s, %s)", (batch, shut, s2 + 10))
    assert (s2, s3) == (s1 + 1, s1 + 11)
    with pytest.raises(errors.UniqueViolation):
        caller.value("SELECT etc_batch.add_step(%s, %s, %s)", (batch, step(9), s3))

    with pytest.raises(errors.CheckViolation):
        caller.run("CALL etc_batch.exec_batch_from_id(%s)", (s1,))
    assert world.effects(batch) == Counter({1: 1, 2: 1})
    log = {r["id"]: r for r in admin.execute(
        "SELECT id, status, attempts, last_sqlstate, added_by::text AS added_by "
        "FROM etc_batch.batch_log WHERE batch = %s", (batch,))}
    assert {i: (r["status"], r["attempts"], r["last_sqlstate"], r["added_by"])
            for i, r in log.items()} == {s1: ("done", 1, None, me), s2: ("done", 1, None, me),
                                         s3: ("failed", 1, "23514", me)}

    admin.execute(sql.SQL("ALTER TABLE public.{} DROP CONSTRAINT shut").format(ident(world.gate)))
    caller.run("SELECT etc_batch.retry_step(%s)", (s3,))
    notices = caller.run("CALL etc_batch.exec_batch_from_id(%s)", (s1,))
    assert notices == [f'step {s1} of batch "{batch}" is already done, skipping',
                       f'step {s2} of batch "{batch}" is already done, skipping',
                       f'step {s3} of batch "{batch}" committed']
    assert world.effects(batch) == Counter({1: 1, 2: 1, 3: 1})
    audit = admin.execute(
        "SELECT step_id, attempt, outcome, status_seen, sqlstate, run_by::text AS run_by, "
        "ran_as::text AS ran_as, pid FROM etc_batch.step_audit WHERE batch = %s ORDER BY audit_id",
        (batch,)).fetchall()
    assert [(a["step_id"], a["attempt"], a["outcome"], a["status_seen"], a["sqlstate"])
            for a in audit] == [(s1, 1, "done", "pending", None), (s2, 1, "done", "pending", None),
                                (s3, 1, "failed", "pending", "23514"),
                                (s1, 1, "skipped", "done", None), (s2, 1, "skipped", "done", None),
                                (s3, 2, "done", "pending", None)]
    assert {(a["run_by"], a["ran_as"], a["pid"]) for a in audit} == {(me, me, caller.pid)}
    with pytest.raises(errors.ObjectNotInPrerequisiteState):
        caller.run("SELECT etc_batch.retry_step(%s)", (s1,))
    assert caller.value("SELECT etc_batch.reset_batch(%s)", (batch,)) == 3

    # a runner that will not wait names the holder; the views show who holds what
    holder = db.connect()
    holder.execute("BEGIN")
    holder.execute("SELECT 1 FROM etc_batch.batch_log WHERE id = %s FOR UPDATE", (s1,))
    notices = caller.run("CALL etc_batch.exec_batch_from_id(%s, wait => false)", (s1,))
    assert notices == [f'step {s1} of batch "{batch}" is being run by process '
                       f'{holder.info.backend_pid}, not waiting']
    locks = caller.where("locks", "kind", "row", "pid, kind, mode, stands_for")
    assert {"pid": holder.info.backend_pid, "kind": "row", "mode": "FOR UPDATE",
            "stands_for": f"step {s1} of batch {quote_literal(db, batch)}"} in locks
    (progress,) = caller.where("chain_progress", "batch", batch)
    assert (progress["steps"], progress["done"], progress["failed"], progress["pending"],
            progress["current_step"], progress["current_pid"]) == (
        3, 0, 0, 3, s1, holder.info.backend_pid)
    holder.execute("ROLLBACK")

    # fenced runs: a wrong generation runs nothing; the right one runs the chain
    lease = f"sec lease {tag}"
    got = caller.row("SELECT * FROM etc_batch.acquire_lease(%s, %s, %s)",
                     (lease, "runner-1", timedelta(seconds=60)))
    assert (got["acquired"], got["holder"], got["generation"]) == (True, "runner-1", 1)
    with pytest.raises(errors.InvalidTransactionInitiation):
        caller.run("CALL etc_batch.exec_batch_from_id(%s, lease_name => %s, lease_holder => %s, "
                   "lease_generation => 2)", (s1, lease, "runner-1"))
    assert world.effects(batch) == Counter({1: 1, 2: 1, 3: 1})
    caller.run("CALL etc_batch.exec_batch_from_id(%s, lease_name => %s, lease_holder => %s, "
               "lease_generation => 1)", (s1, lease, "runner-1"))
    assert world.effects(batch) == Counter({1: 2, 2: 2, 3: 2})
    (progress,) = caller.where("chain_progress", "batch", batch)
    assert (progress["done"], progress["pending"], progress["current_step"]) == (3, 0, None)

    # jobs --------------------------------------------------------------------------------
    target = f"public.{world.orders}"
    cancel, pending = Jsonb({"status": "cancelled"}), Jsonb({"status": "pending"})
    job = f"sec job {tag}"
    ids = [2, 3, 5, 7, 8, 11]
    items = world.items("A", ids)
    got = caller.row(register_sql(), (job, "A", target, Jsonb(items[::-1]), 2, cancel, pending))
    assert got == {"job_id": job, "created": True, "items": 6, "chunks": 3}
    again = caller.row(register_sql(), (job, "A", target, Jsonb(items), 2, cancel, pending))
    assert again["created"] is False
    assert (f'job "{job}" is already registered with the same approval; nothing changed'
            in caller.notices)
    with pytest.raises(errors.DuplicateObject):
        caller.row(register_sql(), (job, "A", target, Jsonb(items[:-1]), 2, cancel, pending))

    drained = caller.row("CALL etc_batch.drain_job(%s, 1)", (job,))
    assert drained == committed(["2", "3"], 1, "pending")
    summary = caller.row("SELECT * FROM etc_batch.job_summary(%s)", (job,))
    assert summary == {"status": "pending", "approved": 6, "committed": 2, "unprocessed": 4,
                       "matching": 2, "drifted": 0, "missing": 0, "parallel": False,
                       "skipped": 0, "failed_at": None, "failure_sqlstate": None,
                       "failure_message": None}
    lease2 = f"sec drainer {tag}"
    generation = caller.row("SELECT * FROM etc_batch.acquire_lease(%s, %s, %s)",
                            (lease2, "drainer", timedelta(seconds=60)))["generation"]
    drained = caller.row("CALL etc_batch.drain_job(%s, NULL, lease_name => %s, "
                         "lease_holder => %s, lease_generation => %s)",
                         (job, lease2, "drainer", generation))
    assert drained == committed(["5", "7", "8", "11"], 2, "done")
    report = caller.rows("SELECT * FROM etc_batch.job_report(%s)", (job,))
    assert [(r["position"], r["item_key"], r["state"], r["revision_committed"], r["revision_now"])
            for r in report] == [(p, str(i), "matching", world.initial[("A", i)][0] + 1,
                                  world.initial[("A", i)][0] + 1) for p, i in enumerate(ids)]
    checks = caller.rows("SELECT * FROM etc_batch.verify_job(%s)", (job,))
    assert len(checks) == 6 and all(c["ok"] for c in checks), checks
    (progress,) = caller.where("job_progress", "job_id", job)
    assert (progress["status"], progress["committed"], progress["approved"],
            float(progress["percent"]), progress["chunks_committed"],
            progress["chunks_total"]) == ("done", 6, 6, 100.0, 3, 3)

    # its revert, under the same look-alikes: previewed, registered, drained, verified
    preview = caller.row("SELECT items, drifted, gone, another_tenant, set_back "
                         "FROM etc_batch.revert_preview(%s)", (job,))
    assert preview == {"items": 6, "drifted": 0, "gone": 0, "another_tenant": 0,
                       "set_back": {"status": "pending"}}
    assert caller.rows("SELECT * FROM etc_batch.revert_preview_left_out(%s)", (job,)) == []
    undo = f"sec undo {tag}"
    assert caller.row("SELECT * FROM etc_batch.register_revert(%s, %s)", (job, undo)) == {
        "job_id": undo, "created": True, "items": 6, "chunks": 3}
    assert caller.row("CALL etc_batch.drain_job(%s)", (undo,))["status"] == "done"
    checks = caller.rows("SELECT * FROM etc_batch.verify_job(%s)", (undo,))
    assert len(checks) == 6 and all(c["ok"] for c in checks), checks
    assert [(r["item_key"], r["state"]) for r in caller.rows(
        "SELECT * FROM etc_batch.job_report(%s)", (undo,))] == [(str(i), "matching") for i in ids]

    # a conflict: the first chunk stays, the job stops
    job2 = f"sec conflict {tag}"
    caller.row(register_sql(), (job2, "A", target, Jsonb(world.items("A", [1, 4, 6, 9])), 2,
                                cancel, pending))
    admin.execute(sql.SQL("UPDATE public.{} SET revision = revision + 1 "
                          "WHERE tenant = 'A' AND id = 6").format(ident(world.orders)))
    with pytest.raises(errors.IntegrityConstraintViolation) as conflict:
        caller.row("CALL etc_batch.drain_job(%s)", (job2,))
    seen = world.initial[("A", 6)][0]
    assert conflict.value.diag.message_detail == (
        f"Item 6 (the 3rd of 4 approved items) was approved at revision {seen}, "
        f"but the row now has revision {seen + 1}.")
    with pytest.raises(errors.IntegrityConstraintViolation):
        caller.row("CALL etc_batch.drain_job(%s)", (job2,))
    state = job_state(db, job2)
    assert (state["status"], state["next_index"], state["problem"]["key"]) == ("conflict", 2, "6")
    assert state["problem"]["found"]["revision"] == seen + 1

    # progress changed outside etc_batch: refused by the drainer, found by verify_job
    job3 = f"sec corrupt {tag}"
    caller.row(register_sql(), (job3, "A", target, Jsonb(world.items("A", [10, 12])), 1,
                                cancel, pending))
    caller.row("CALL etc_batch.drain_job(%s, 1)", (job3,))
    admin.execute("UPDATE etc_batch.job_audit_chunk SET chunk = chunk WHERE job_id = %s", (job3,))
    with pytest.raises(errors.DataCorrupted):
        caller.row("CALL etc_batch.drain_job(%s)", (job3,))
    assert job_state(db, job3)["status"] == "corrupt"
    job4 = f"sec verify {tag}"
    caller.row(register_sql(), (job4, "B", target, Jsonb(world.items("B", [1, 2])), 1,
                                cancel, pending))
    caller.row("CALL etc_batch.drain_job(%s, 1)", (job4,))
    admin.execute("DELETE FROM etc_batch.job_audit_chunk WHERE job_id = %s", (job4,))
    checks = {c["check_name"]: c["ok"] for c in caller.rows(
        "SELECT * FROM etc_batch.verify_job(%s)", (job4,))}
    assert checks["changes outside etc_batch"] is False and checks["audit rows"] is False
    assert job_state(db, job4)["status"] == "corrupt"

    # stopped by a person, unless it is done
    with pytest.raises(errors.ObjectNotInPrerequisiteState):
        caller.run("SELECT etc_batch.abort_job(%s, %s)", (job, "too late"))
    job5 = f"sec abort {tag}"
    caller.row(register_sql(), (job5, "B", target, Jsonb(world.items("B", [3, 4])), 1,
                                cancel, pending))
    caller.run("SELECT etc_batch.abort_job(%s, %s)", (job5, "withdrawn"))
    state = job_state(db, job5)
    assert (state["status"], state["status_reason"], state["problem"]["aborted_by"],
            state["problem"]["previous_status"]) == ("aborted", "withdrawn", me, "pending")

    # a handler job
    job6 = f"sec handler {tag}"
    handler = f"public.{world.handler}(pg_catalog.jsonb)"
    got = caller.row(register_sql(handler=True),
                     (job6, "B", target, Jsonb(world.items("B", [5, 6, 7])), 2, handler))
    assert got["created"] is True
    drained = caller.row("CALL etc_batch.drain_job(%s)", (job6,))
    assert drained == committed(["5", "6", "7"], 2, "done")

    # the business table: exactly what the jobs committed, nothing else
    changes = {("A", i): "cancelled" for i in [1, 4, 10]}
    changes.update({("B", 1): "cancelled"})
    changes.update({("B", i): "handled" for i in (5, 6, 7)})
    want = world.expected_rows(changes)
    revision, qty, status, due = want[("A", 6)]
    want[("A", 6)] = (revision + 1, qty, status, due)  # the other operator's change
    for i in ids:  # the first job's, set back by its revert: pending, two revisions on
        revision, qty, status, due = want[("A", i)]
        want[("A", i)] = (revision + 2, qty, status, due)
    assert world.snapshot() == want
    assert audit_keys(db, job) == [str(i) for i in ids]
    assert audit_keys(db, job2) == ["1", "4"]

    # leases --------------------------------------------------------------------------------
    lease3 = f"sec leader {tag}"
    first = caller.row("SELECT * FROM etc_batch.acquire_lease(%s, 'w1', %s)",
                       (lease3, timedelta(seconds=60)))
    renewed = caller.row("SELECT * FROM etc_batch.acquire_lease(%s, 'w1', %s)",
                         (lease3, timedelta(seconds=60)))
    refused = caller.row("SELECT * FROM etc_batch.acquire_lease(%s, 'w2', %s)",
                         (lease3, timedelta(seconds=60)))
    assert (first["acquired"], first["generation"]) == (True, 1)
    assert (renewed["acquired"], renewed["generation"]) == (True, 1)
    assert renewed["expires_at"] >= first["expires_at"]
    assert (refused["acquired"], refused["holder"], refused["generation"]) == (False, "w1", 1)
    caller.run("SELECT etc_batch.check_lease(%s, 'w1', 1)", (lease3,))
    with pytest.raises(errors.InvalidTransactionInitiation):
        caller.run("SELECT etc_batch.check_lease(%s, 'w2', 1)", (lease3,))
    with pytest.raises(errors.ObjectNotInPrerequisiteState):
        caller.run("SELECT etc_batch.release_lease(%s, 'w2')", (lease3,))
    assert caller.value("SELECT etc_batch.release_lease(%s, 'w1')", (lease3,)) is True
    assert caller.value("SELECT etc_batch.release_lease(%s, 'w1')", (lease3,)) is False
    taken = caller.row("SELECT * FROM etc_batch.acquire_lease(%s, 'w2', %s)",
                       (lease3, timedelta(seconds=60)))
    assert (taken["acquired"], taken["holder"], taken["generation"]) == (True, "w2", 2)
    caller.value("SELECT etc_batch.release_lease(%s, 'w2')", (lease3,))
    shown = caller.where("leases", "name", lease3, "name, holder, generation, expired")
    assert shown == [{"name": lease3, "holder": "w2", "generation": 2, "expired": True}]

    # lock helpers ------------------------------------------------------------------------
    ns, key = f"sec ns {tag}", "k1"
    expected_key = documented_lock_key(db, ns, key)
    assert caller.value("SELECT etc_batch.lock_key(%s, %s)", (ns, key)) == expected_key
    with caller.conn.transaction():
        assert caller.value("SELECT etc_batch.try_xact_lock(%s, %s)", (ns, key)) is True
        caller.run("SELECT etc_batch.xact_lock(%s, %s)", (ns, "k2"))
        held = caller.where("locks", "kind", "advisory", "pid, stands_for")
        assert {"pid": caller.pid, "stands_for": f"advisory key {expected_key}"} in held
        assert sum(1 for h in held if h["pid"] == caller.pid) == 2
    left_held = admin.execute("SELECT count(*) AS n FROM pg_locks "
                              "WHERE pid = %s AND locktype = 'advisory'", (caller.pid,))
    assert left_held.fetchone()["n"] == 0

    # the doctor --------------------------------------------------------------------------
    doctor = {(r["check_name"], r["status"]): r
              for r in caller.rows("SELECT * FROM etc_batch.doctor()")}
    assert ("extension version", "ok") in doctor
    assert (f"job {job2}", "fail") in doctor and (f"job {job3}", "fail") in doctor
    assert doctor[(f"lease {lease3}", "warn")]["detail"].endswith(
        f"its last holder was {quote_literal(db, 'w2')} at generation 2. Nobody renews it.")
    assert not [k for k in doctor if k[0] == "privileges"]

    # pruning history: everything that ended before now
    expected = admin.execute(
        """SELECT (SELECT count(*) FROM etc_batch.step_audit
                    WHERE coalesce(finished_at, lock_acquired_at) < clock_timestamp()) AS steps,
                  (SELECT count(*) FROM etc_batch.job
                    WHERE status IN ('done', 'aborted', 'reverted')
                      AND finished_at < clock_timestamp()) AS jobs,
                  (SELECT count(*) FROM etc_batch.launch
                    WHERE status <> 'running' AND ended_at < clock_timestamp()) AS launches"""
    ).fetchone()
    pruned = caller.row("SELECT * FROM etc_batch.prune_history(%s)", (timedelta(microseconds=1),))
    assert pruned == {"step_audit_rows": expected["steps"], "jobs_forgotten": expected["jobs"],
                      "launches_forgotten": expected["launches"]}
    left = {r["job_id"]: r["status"] for r in admin.execute(
        "SELECT job_id, status FROM etc_batch.job WHERE job_id = ANY(%s)",
        ([job, job2, job3, job4, job5, job6],))}
    assert left == {job2: "conflict", job3: "corrupt", job4: "corrupt"}

    # nothing planted ran, and the session still resolves to the look-alikes
    assert caller.captures == [], "\n".join(caller.captures)
    assert look.log() == []
    assert caller.value("SHOW search_path") == "evil, public, pg_catalog"
    caller.probe(look)
    caller.conn.close()
    look.conn.close()


# 2. odd identifiers ----------------------------------------------------------------------

SCHEMA = 'sch"é; --x/*y*/'
TABLE = 'we"ird; --tbl'
KEY = 'ключ "id"; --'
TENANT = "sü'ß/*x*/"
REV = 're"v; -- */'
QTY = "q'ty */ --"
NOTE = "back\\slash $1 {0}"
COMMA = "a,b;c"
STATUS = "st'at;us */"
FLAG = '注文 "flag"'
# columns named like etc_batch's defaults, playing no role here
PLAIN_ID, PLAIN_REVISION = "id", "revision"
COLUMNS = [KEY, TENANT, REV, QTY, NOTE, COMMA, STATUS, FLAG, PLAIN_ID, PLAIN_REVISION]

KEYS = ["o'1; --", 'o"2/*', "ключ-3", "x\\y", "日本 4", "semi;colon", "$1", "%s{}",
        "-- c", "/* c */", "E'\\x41'"]
TENANT_1 = "t'en\"ant; --ü"
TENANT_2 = "other'); DROP TABLE x; --"
HANDLER = "h\"and'ler; --ü"
WRONG_NOTE = "n'o\"pe \\ ü"


def json_text(value):
    """A JSON value as etc_batch writes it into a message."""
    return json.dumps(value, ensure_ascii=False)


class OddTable:
    """A table whose schema, name and columns are odd, with the same odd keys for two
    odd tenants; `initial` is (tenant, key) -> the row's values in COLUMNS order."""

    def __init__(self, db):
        self.db = db
        self.schema = f"{SCHEMA}{secrets.token_hex(2)}"
        self.qualified = sql.SQL("{}.{}").format(ident(self.schema), ident(TABLE))
        a = db.admin
        a.execute(sql.SQL("CREATE SCHEMA {}").format(ident(self.schema)))
        a.execute(sql.SQL(
            "CREATE TABLE {t} ({key} text, {tenant} text, {rev} int8 NOT NULL, {qty} int4, "
            "{note} text, {comma} text, {status} text NOT NULL, {flag} int4 NOT NULL, "
            "{pid} int4, {prev} int4, PRIMARY KEY ({tenant}, {key}))").format(
                t=self.qualified, key=ident(KEY), tenant=ident(TENANT), rev=ident(REV),
                qty=ident(QTY), note=ident(NOTE), comma=ident(COMMA), status=ident(STATUS),
                flag=ident(FLAG), pid=ident(PLAIN_ID), prev=ident(PLAIN_REVISION)))
        rows = []
        for n, k in enumerate(KEYS):
            for tenant in (TENANT_1, TENANT_2):
                note = None if n % 3 == 0 else f"n'o\"te {n}; --"
                rows.append((k, tenant, 10 + n, n % 4, note, f"v,{n}", "pending", 0, n, 100 + n))
        with a.cursor() as cur:
            cur.executemany(
                sql.SQL("INSERT INTO {} ({}) VALUES ({})").format(
                    self.qualified, sql.SQL(", ").join(map(ident, COLUMNS)),
                    sql.SQL(", ").join(sql.Placeholder() * len(COLUMNS))),
                rows)
        self.initial = self.snapshot()

    def snapshot(self):
        rows = self.db.admin.execute(sql.SQL("SELECT * FROM {}").format(self.qualified)).fetchall()
        return {(r[TENANT], r[KEY]): tuple(r[c] for c in COLUMNS) for r in rows}

    def item(self, key, tenant=TENANT_1, **override):
        values = dict(zip(COLUMNS, self.initial[(tenant, key)]))
        item = {KEY: key, REV: values[REV], QTY: values[QTY], NOTE: values[NOTE],
                COMMA: values[COMMA], PLAIN_ID: values[PLAIN_ID],
                PLAIN_REVISION: values[PLAIN_REVISION]}
        item.update(override)
        return item

    def register(self, conn, job, items, chunk_size, **kwargs):
        args = dict(job_id=job, tenant=TENANT_1, target=self.regclass(),
                    items=Jsonb(items), chunk_size=chunk_size,
                    key_column=KEY, tenant_column=TENANT, revision_column=REV)
        args.update(kwargs)
        names = list(args)
        casts = {"target": "::regclass", "handler": "::regprocedure"}
        return conn.cursor(row_factory=dict_row).execute(
            "SELECT * FROM etc_batch.register_job("
            + ", ".join(f"{n} => %s{casts.get(n, '')}" for n in names) + ")",
            [args[n] for n in names]).fetchone()

    def regclass(self):
        return self.qualified.as_string(None)

    def changed(self, keys, status, flag):
        """The table as it must be once `keys` of TENANT_1 got status and flag."""
        want = dict(self.initial)
        for k in keys:
            row = list(self.initial[(TENANT_1, k)])
            row[COLUMNS.index(REV)] += 1
            row[COLUMNS.index(STATUS)] = status
            row[COLUMNS.index(FLAG)] = flag
            want[(TENANT_1, k)] = tuple(row)
        return want


def drain(conn, job, max_chunks=None):
    return conn.cursor(row_factory=dict_row).execute(
        "CALL etc_batch.drain_job(%s, %s::integer)", (job, max_chunks)).fetchone()


def committed(keys, chunks, status):
    """drain_job's result for a call that committed `keys` (as text), in `chunks` chunks."""
    return {"committed_chunks": chunks, "committed_items": len(keys),
            "first_key": keys[0] if keys else None, "last_key": keys[-1] if keys else None,
            "status": status}


def test_odd_identifiers_and_values_reach_exactly_the_approved_rows(db):
    table = OddTable(db)
    approved = KEYS[:8]
    job = "job'; DROP TABLE x; --\"ü/*"
    set_values = {STATUS: "can'celled; --", FLAG: 7}
    conn = db.connect()
    items = [table.item(k) for k in approved]
    got = table.register(conn, job, items[::-1], 3, set_values=Jsonb(set_values),
                         expect=Jsonb({STATUS: "pending"}))
    assert got == {"job_id": job, "created": True, "items": 8, "chunks": 3}
    stored = db.admin.execute(
        "SELECT key_columns::text[] AS k, tenant_column::text AS t, revision_column::text AS r, "
        "guard_columns, set_values, expect, tenant FROM etc_batch.job WHERE job_id = %s",
        (job,)).fetchone()
    assert (stored["k"], stored["t"], stored["r"], stored["tenant"]) == ([KEY], TENANT, REV, TENANT_1)
    assert stored["guard_columns"] == sorted([QTY, NOTE, COMMA, PLAIN_ID, PLAIN_REVISION],
                                             key=lambda c: c.encode())
    assert (stored["set_values"], stored["expect"]) == (set_values, {STATUS: "pending"})

    order = utf8_order(approved)
    first = drain(conn, job, 1)
    assert first == committed(order[:3], 1, "pending")
    rest = drain(conn, job)
    assert rest == committed(order[3:], 2, "done")
    assert table.snapshot() == table.changed(approved, "can'celled; --", 7)

    frozen = db.admin.execute(
        "SELECT item_key, revision, guards FROM etc_batch.job_item WHERE job_id = %s "
        "ORDER BY position", (job,)).fetchall()
    assert [r["item_key"] for r in frozen] == order
    for r in frozen:
        item = table.item(r["item_key"])
        assert r["revision"] == item[REV]
        assert r["guards"] == {c: v for c, v in item.items() if c not in (KEY, REV)}
    audit = db.admin.execute(
        "SELECT item_key, revision_before, revision_after, guards FROM etc_batch.job_audit_items "
        "WHERE job_id = %s ORDER BY position", (job,)).fetchall()
    assert [(a["item_key"], a["revision_before"], a["revision_after"]) for a in audit] == [
        (k, table.item(k)[REV], table.item(k)[REV] + 1) for k in order]
    report = conn.execute("SELECT item_key, state FROM etc_batch.job_report(%s)", (job,)).fetchall()
    assert report == [(k, "matching") for k in order]
    assert all(ok for _, ok, _ in conn.execute("SELECT * FROM etc_batch.verify_job(%s)", (job,)))

    # a guard on an odd column that no longer holds: named in the conflict, in its record
    job2 = 'j2 "x"; --'
    wrong = KEYS[9]
    items2 = [table.item(KEYS[8]), table.item(wrong, **{NOTE: WRONG_NOTE}), table.item(KEYS[10])]
    table.register(conn, job2, items2, 3, set_values=Jsonb({FLAG: 9}))
    with pytest.raises(errors.IntegrityConstraintViolation) as conflict:
        drain(conn, job2)
    current_note = table.initial[(TENANT_1, wrong)][COLUMNS.index(NOTE)]
    position = utf8_order([KEYS[8], wrong, KEYS[10]]).index(wrong)
    assert conflict.value.diag.message_detail == (
        f"Item {wrong} (the {['1st', '2nd', '3rd'][position]} of 3 approved items) was approved "
        f"with {NOTE} = {json_text(WRONG_NOTE)}, "
        f"but the row now has {NOTE} = {json_text(current_note)}.")
    problem = job_state(db, job2)["problem"]
    assert problem["key"] == wrong
    assert problem["expected"]["guards"][NOTE] == WRONG_NOTE
    assert set(problem["found"]) == set(COLUMNS)
    assert problem["found"][TENANT] == TENANT_1
    # the whole chunk rolled back: the table is as the first job left it
    assert table.snapshot() == table.changed(approved, "can'celled; --", 7)


def test_handler_with_an_odd_name_changes_odd_columns(db):
    table = OddTable(db)
    h = sql.SQL("{}.{}").format(ident(table.schema), ident(HANDLER))
    db.admin.execute(sql.SQL(
        """CREATE FUNCTION {h}(item jsonb) RETURNS jsonb LANGUAGE plpgsql
           SET search_path = pg_catalog, pg_temp AS $$
           DECLARE r jsonb;
           BEGIN
             UPDATE {t} AS t SET {status} = 'handled', {flag} = 5, {rev} = t.{rev} + 1
              WHERE t.{tenant} = item ->> {tenant_l} AND t.{key} = item ->> {key_l}
                AND t.{rev} = (item ->> {rev_l})::int8
                AND t.{note} IS NOT DISTINCT FROM item ->> {note_l}
             RETURNING to_jsonb(t) INTO r;
             RETURN r;
           END $$""").format(
        h=h, t=table.qualified, status=ident(STATUS), flag=ident(FLAG), rev=ident(REV),
        tenant=ident(TENANT), key=ident(KEY), note=ident(NOTE), tenant_l=sql.Literal(TENANT),
        key_l=sql.Literal(KEY), rev_l=sql.Literal(REV), note_l=sql.Literal(NOTE)))
    signature = sql.SQL("{}(pg_catalog.jsonb)").format(h).as_string(None)
    keys = KEYS[2:7]
    job = "handler 'job'; --"
    conn = db.connect()
    got = table.register(conn, job, [table.item(k) for k in keys], 2, set_values=None,
                         handler=signature)
    assert got["created"] is True
    assert db.admin.execute("SELECT to_regprocedure(handler)::oid = %s::regprocedure::oid AS same "
                            "FROM etc_batch.job WHERE job_id = %s",
                            (signature, job)).fetchone()["same"]
    result = drain(conn, job)
    assert result == committed(utf8_order(keys), 3, "done")
    assert table.snapshot() == table.changed(keys, "handled", 5)


def test_batch_job_lease_and_lock_names_round_trip(db):
    table = OddTable(db)
    effect = sql.SQL("{}.{}").format(ident(table.schema), ident("ef'fect; --"))
    db.admin.execute(sql.SQL("CREATE TABLE {} ({} text)").format(effect, ident(NOTE)))
    batch = "b'a\"t;ch --/*ü*/ ключ"
    # SQL by design; what it says, including what only looks like transaction control
    # inside a string and comments, is stored and run as written
    command = (sql.SQL("INSERT INTO {} ({}) VALUES ('x''; COMMIT; --') "
                       "/* ; ROLLBACK */ -- ; COMMIT").format(effect, ident(NOTE)).as_string(None))
    conn = db.connect()
    step_id = conn.execute("SELECT etc_batch.add_step(%s, %s)", (batch, command)).fetchone()[0]
    stored = db.admin.execute("SELECT batch, command FROM etc_batch.batch_log WHERE id = %s",
                              (step_id,)).fetchone()
    assert (stored["batch"], stored["command"]) == (batch, command)

    lease, holder = "l'ease\"; --/*ü*/", "h'older; DROP --ü"
    got = conn.execute("SELECT * FROM etc_batch.acquire_lease(%s, %s, '1 minute')",
                       (lease, holder)).fetchone()
    assert got[:3] == (True, holder, 1)
    notices = []
    conn.add_notice_handler(lambda d: notices.append(d.message_primary))
    with pytest.raises(errors.InvalidTransactionInitiation) as fenced:
        conn.execute("CALL etc_batch.exec_batch_from_id(%s, lease_name => %s, "
                     "lease_holder => %s, lease_generation => 1)", (step_id, lease, holder + "x"))
    assert fenced.value.diag.message_primary == (
        f'lease "{lease}" is not held by "{holder}x" at generation 1')
    conn.execute("CALL etc_batch.exec_batch_from_id(%s, lease_name => %s, lease_holder => %s, "
                 "lease_generation => 1)", (step_id, lease, holder))
    assert notices == [f'step {step_id} of batch "{batch}" committed']
    assert db.admin.execute(sql.SQL("SELECT {} AS v FROM {}").format(ident(NOTE), effect)
                            ).fetchall() == [{"v": "x'; COMMIT; --"}]
    assert db.admin.execute("SELECT batch FROM etc_batch.step_audit WHERE step_id = %s",
                            (step_id,)).fetchone()["batch"] == batch
    progress = conn.execute("SELECT batch, steps, done FROM etc_batch.chain_progress "
                            "WHERE batch = %s", (batch,)).fetchone()
    assert progress == (batch, 1, 1)
    shown = conn.execute("SELECT name, holder, generation FROM etc_batch.leases WHERE name = %s",
                         (lease,)).fetchall()
    assert shown == [(lease, holder, 1)]

    # the locks view quotes what it names
    job = "j'ob \"; --ü"
    table.register(conn, job, [table.item(KEYS[0])], 1, set_values=Jsonb({FLAG: 1}))
    ns, key = "n's\"; --", "k'/*ü*/"
    lock_key = conn.execute("SELECT etc_batch.lock_key(%s, %s)", (ns, key)).fetchone()[0]
    assert lock_key == documented_lock_key(db, ns, key)
    assert lock_key != conn.execute("SELECT etc_batch.lock_key(%s, %s)", (ns + key[0], key[1:])
                                    ).fetchone()[0]
    holder_conn = db.connect()
    with holder_conn.transaction():
        holder_conn.execute("SELECT 1 FROM etc_batch.batch_log WHERE id = %s FOR UPDATE",
                            (step_id,))
        holder_conn.execute("SELECT 1 FROM etc_batch.job WHERE job_id = %s FOR UPDATE", (job,))
        holder_conn.execute("SELECT etc_batch.check_lease(%s, %s, 1)", (lease, holder))
        assert holder_conn.execute("SELECT etc_batch.try_xact_lock(%s, %s)",
                                   (ns, key)).fetchone()[0] is True
        stands_for = {r[0] for r in conn.execute(
            "SELECT stands_for FROM etc_batch.locks WHERE pid = %s",
            (holder_conn.info.backend_pid,))}
        assert {f"step {step_id} of batch {quote_literal(db, batch)}",
                f"job {quote_literal(db, job)}", f"lease {quote_literal(db, lease)}",
                f"advisory key {lock_key}"} <= stands_for, stands_for



def test_hints_carry_odd_job_ids_as_literals_a_person_can_paste(db):
    table = OddTable(db)
    db.admin.execute(sql.SQL("ALTER TABLE {} ADD CONSTRAINT small CHECK ({} < 100)")
                     .format(table.qualified, ident(FLAG)))
    conn = db.connect()
    job = "j'ob\\; --\"ü"
    # a value a CHECK on its column alone refuses is refused at registration, the odd
    # column and constraint named as they are, and nothing is stored
    with pytest.raises(errors.CheckViolation) as refused:
        table.register(conn, job, [table.item(KEYS[0])], 1, set_values=Jsonb({FLAG: 1000}))
    assert refused.value.diag.message_primary == (
        f'set_values sets column "{FLAG}" to a value its check constraint "small" refuses')
    assert db.admin.execute("SELECT count(*) AS n FROM etc_batch.job WHERE job_id = %s",
                            (job,)).fetchone()["n"] == 0
    # one over two columns is the chunk's to meet: a chunk that fails for a reason that
    # is not a conflict, and the hint names the call
    db.admin.execute(sql.SQL("ALTER TABLE {} DROP CONSTRAINT small, "
                             "ADD CONSTRAINT small CHECK ({} < 100 + {})")
                     .format(table.qualified, ident(FLAG), ident(QTY)))
    table.register(conn, job, [table.item(KEYS[0])], 1, set_values=Jsonb({FLAG: 1000}))
    with pytest.raises(errors.CheckViolation) as failed:
        drain(conn, job)
    assert failed.value.diag.message_hint == (
        f"Fix the cause and call etc_batch.drain_job({quote_literal(db, job)}) again.")
    assert job_state(db, job)["status"] == "pending"
    assert table.snapshot() == table.initial

    # a job stopped half-way: the doctor's hint
    half = "j'half\\; --"
    table.register(conn, half, [table.item(KEYS[1]), table.item(KEYS[2])], 1,
                   set_values=Jsonb({FLAG: 2}))
    drain(conn, half, 1)
    hints = {r[0]: r[1] for r in conn.execute(
        "SELECT check_name, hint FROM etc_batch.doctor() WHERE check_name LIKE 'job %'")}
    assert hints[f"job {half}"] == f"CALL etc_batch.drain_job({quote_literal(db, half)}) to go on."
    # and the literal is the job id: pasted, it continues that job
    conn.execute(f"CALL etc_batch.drain_job({quote_literal(db, half)})")
    assert job_state(db, half)["status"] == "done"


def test_unique_indexes_are_matched_by_column_names_with_commas(db):
    # (tenant, key) is unique here, though the names hold commas
    good = f"commas_ok_{secrets.token_hex(3)}"
    db.admin.execute(sql.SQL(
        'CREATE TABLE {} ("t,x" text, "k,1" int, "r,v" int NOT NULL, st text, '
        'PRIMARY KEY ("t,x", "k,1"))').format(ident(good)))
    db.admin.execute(sql.SQL("INSERT INTO {} VALUES ('A', 1, 1, 'p'), ('A', 2, 1, 'p'), "
                             "('B', 1, 1, 'p')").format(ident(good)))
    conn = db.connect()
    job = f"commas {good}"
    got = conn.execute(
        "SELECT created FROM etc_batch.register_job(%s, 'A', %s::regclass, %s, 1, %s, "
        "key_column => 'k,1', tenant_column => 't,x', revision_column => 'r,v')",
        (job, good, Jsonb([{"k,1": 1, "r,v": 1}]), Jsonb({"st": "x"}))).fetchone()
    assert got == (True,)
    assert drain(conn, job)["status"] == "done"
    assert db.admin.execute(sql.SQL('SELECT "t,x" AS t, "k,1" AS k, "r,v" AS r, st FROM {} '
                                    'ORDER BY 1, 2').format(ident(good))).fetchall() == [
        {"t": "A", "k": 1, "r": 2, "st": "x"}, {"t": "A", "k": 2, "r": 1, "st": "p"},
        {"t": "B", "k": 1, "r": 1, "st": "p"}]

    # here only a column named "t,k" is unique; (t, k) is not, and one approved item
    # would change three rows
    bad = f"commas_bad_{secrets.token_hex(3)}"
    db.admin.execute(sql.SQL('CREATE TABLE {} (t text, k int, revision int, st text, '
                             '"t,k" int UNIQUE)').format(ident(bad)))
    db.admin.execute(sql.SQL("INSERT INTO {} VALUES ('A', 1, 1, 'p', 1), ('A', 1, 1, 'p', 2), "
                             "('A', 1, 1, 'p', 3)").format(ident(bad)))
    job = f"commas {bad}"
    with pytest.raises(errors.InvalidColumnReference) as refused:
        conn.execute(
            "SELECT * FROM etc_batch.register_job(%s, 'A', %s::regclass, %s, 1, %s, "
            "key_column => 'k', tenant_column => 't')",
            (job, bad, Jsonb([{"k": 1, "revision": 1}]), Jsonb({"st": "x"})))
    assert refused.value.diag.message_primary == (
        f'key k within tenant column "t" of table {bad} does not name one row')
    assert job_state(db, job) is None
    still = db.admin.execute(sql.SQL("SELECT st FROM {}").format(ident(bad))).fetchall()
    assert {r["st"] for r in still} == {"p"}


# 3. privileges --------------------------------------------------------------------------

# What PUBLIC may execute, as docs/security.md documents it: the lock helpers, the
# reports, which show a job only to its registrant and to readers of etc_batch.job, and
# the functions that unfold a chunk's row of the frozen list or the audit, which read
# nothing.
PUBLIC_ROUTINES = {"etc_batch.lock_key(text,text)", "etc_batch.try_xact_lock(text,text)",
                   "etc_batch.xact_lock(text,text)", "etc_batch.job_report(text)",
                   "etc_batch.job_summary(text)", "etc_batch.current_run()",
                   "etc_batch.chunk_audit_items(integer,bigint[],integer[],jsonb)",
                   "etc_batch.chunk_items(integer,text[],bigint[],text[])",
                   # pure: the clock time work takes inside a pace's windows
                   "etc_batch.wall_seconds_in_windows(doubleprecision,text[],text)",
                   # the node of a Citus shard, from Citus's catalog, which PUBLIC reads:
                   # job_progress.chunks_per_node
                   "etc_batch.shard_node(bigint)"}
# What PUBLIC may read: job_progress, whose rows are those jobs, and launches, whose rows
# are the reader's own launches.
PUBLIC_RELATIONS = {"job_progress", "launches"}

MEMBERS = """
    SELECT p.oid, p.oid::regprocedure::text AS signature, p.proname, p.prokind, p.prosecdef,
           p.proconfig, l.lanname, p.prosqlbody IS NOT NULL AS sql_body,
           p.prorettype = 'trigger'::regtype AS trigger,
           EXISTS (SELECT FROM aclexplode(coalesce(p.proacl, acldefault('f', p.proowner))) x
                    WHERE x.grantee = 0 AND x.privilege_type = 'EXECUTE') AS public_execute
      FROM pg_depend d
      JOIN pg_proc p ON p.oid = d.objid
      JOIN pg_language l ON l.oid = p.prolang
     WHERE d.classid = 'pg_proc'::regclass AND d.deptype = 'e'
       AND d.refclassid = 'pg_extension'::regclass
       AND d.refobjid = (SELECT oid FROM pg_extension WHERE extname = 'etc_batch')
     ORDER BY 2"""


def extension_routines(db):
    return db.admin.execute(MEMBERS).fetchall()


def compact(signature):
    return signature.replace(" ", "")


def test_routines_of_the_extension_as_the_catalog_records_them(db):
    routines = extension_routines(db)
    names = {r["proname"] for r in routines}
    assert names == {"abandon_run", "abort_job", "acquire_lease", "add_step", "attach_job_tables",
                     "check_lease", "chunk_audit_items", "chunk_items", "count_job_changes",
                     "create_job_tables",
                     "current_run",
                     "define_chain", "doctor", "drain_job",
                     "exec_batch_from_id", "job_report", "job_summary", "launch_batch", "launch_job",
                     "lock_key", "pace_job", "pause_batch", "pause_job", "prune_history", "register_job",
                     "register_job_from_query", "register_remainder", "register_revert",
                     "release_lease", "reset_batch", "revert_preview", "revert_preview_left_out",
                     "resume_batch", "resume_job", "resume_launches", "retry_step", "run_chain",
                     "shard_node", "stop_launch",
                     "try_xact_lock",
                     "verify_job", "wall_seconds_in_windows", "xact_lock"}, (
        "a routine was added or removed: decide who may run it, then update this list")

    for r in routines:
        config = r["proconfig"] or []
        if r["prokind"] == "p":
            # a procedure with SECURITY DEFINER or a SET clause runs atomically, so it
            # could not commit
            assert not r["prosecdef"] and config == [], r
        if r["prosecdef"]:
            paths = [c for c in config if c.startswith("search_path=")]
            assert paths, f"{r['signature']} is SECURITY DEFINER without a pinned search_path"
            assert [s.strip() for s in paths[0].split("=", 1)[1].split(",")] == [
                "pg_catalog", "pg_temp"], r
            assert not r["public_execute"], (
                f"{r['signature']} is SECURITY DEFINER and PUBLIC may run it")
        if r["lanname"] in ("plpgsql", "sql") and not r["sql_body"]:
            # its body is parsed at every call, under the caller's search_path unless
            # pinned; a SQL-standard body is bound when it is created
            assert any(c.startswith("search_path=pg_catalog") for c in config), (
                f"{r['signature']} resolves names under the caller's search_path")
        if r["lanname"] not in ("plpgsql", "sql"):
            assert r["lanname"] == "c", r
    assert {r["signature"] for r in routines if r["prosecdef"]} == {
        "etc_batch.prune_history(interval)"}
    assert {compact(r["signature"]) for r in routines if r["public_execute"]} == PUBLIC_ROUTINES

    schema = db.admin.execute(
        """SELECT array_agg(x.privilege_type) FILTER (WHERE x.grantee = 0) AS public
             FROM pg_namespace n, aclexplode(coalesce(n.nspacl, acldefault('n', n.nspowner))) x
            WHERE n.nspname = 'etc_batch'""").fetchone()
    assert schema["public"] is None, "PUBLIC has privileges on schema etc_batch"
    relations = db.admin.execute(
        """SELECT c.relname, array_agg(x.privilege_type) FILTER (WHERE x.grantee = 0) AS public
             FROM pg_class c
             CROSS JOIN LATERAL aclexplode(coalesce(c.relacl, acldefault(
                 CASE WHEN c.relkind = 'S' THEN 's'::"char" ELSE 'r'::"char" END, c.relowner))) x
            WHERE c.relnamespace = 'etc_batch'::regnamespace
              AND c.relkind IN ('r', 'v', 'm', 'S', 'p', 'f')
            GROUP BY c.relname""").fetchall()
    assert {r["relname"] for r in relations} >= {"batch_log", "step_audit", "job", "job_item",
                                                 "job_item_chunk", "job_audit", "job_audit_chunk",
                                                 "job_audit_items", "lease",
                                                 "leases", "locks", "job_progress",
                                                 "chain_progress"}
    assert {r["relname"] for r in relations if r["public"]} == PUBLIC_RELATIONS
    assert {r["relname"]: r["public"] for r in relations if r["public"]} == {
        "job_progress": ["SELECT"], "launches": ["SELECT"]}


def null_call(r, arg_types):
    args = ", ".join(f"NULL::{t}" for t in arg_types)
    verb = "CALL" if r["prokind"] == "p" else "SELECT"
    return f"{verb} etc_batch.{r['proname']}({args})"


def routine_arg_types(db, oid):
    return db.admin.execute(
        "SELECT array_agg(format_type(t, NULL) ORDER BY n) AS types "
        "FROM pg_proc p, unnest(p.proargtypes::oid[]) WITH ORDINALITY AS a(t, n) WHERE p.oid = %s",
        (oid,)).fetchone()["types"] or []


def etc_batch_rows(db):
    return db.admin.execute(
        "SELECT (SELECT count(*) FROM etc_batch.batch_log) AS steps, "
        "(SELECT count(*) FROM etc_batch.job) AS jobs, "
        "(SELECT count(*) FROM etc_batch.lease) AS leases").fetchone()


def tables_of_the_schema(db):
    return [(r["name"], r["relkind"]) for r in db.admin.execute(
        "SELECT c.oid::regclass::text AS name, c.relkind::text AS relkind FROM pg_class c "
        "WHERE c.relnamespace = 'etc_batch'::regnamespace "
        "AND c.relkind IN ('r', 'v', 'm', 'S', 'p', 'f') ORDER BY 1")]


@pytest.mark.parametrize("usage", [True, False], ids=["with_usage", "without_usage"])
def test_a_role_granted_nothing_can_run_only_the_lock_helpers(db, roles, usage):
    nobody = roles("nobody")
    if usage:
        db.admin.execute(sql.SQL("GRANT USAGE ON SCHEMA etc_batch TO {}").format(ident(nobody)))
    conn = db.connect()
    conn.execute(sql.SQL("SET ROLE {}").format(ident(nobody)))
    before = etc_batch_rows(db)

    ran = set()
    for r in extension_routines(db):
        may = db.admin.execute("SELECT has_function_privilege(%s, %s, 'EXECUTE') AS may",
                               (nobody, r["oid"])).fetchone()["may"]
        assert may is (compact(r["signature"]) in PUBLIC_ROUTINES), (r["signature"], may)
        if r["trigger"]:
            continue
        statement = null_call(r, routine_arg_types(db, r["oid"]))
        try:
            conn.execute(statement)
        except errors.InsufficientPrivilege as e:
            assert not usage or not may, (statement, str(e))
            kind = "procedure" if r["prokind"] == "p" else "function"
            denied = f"{kind} {r['proname']}" if usage else "schema etc_batch"
            assert f"permission denied for {denied}" in str(e), (statement, str(e))
            continue
        except errors.NullValueNotAllowed:
            pass  # it ran, and refused the NULLs
        ran.add(compact(r["signature"]))
    assert ran == (PUBLIC_ROUTINES if usage else set())

    if usage:
        key = conn.execute("SELECT etc_batch.lock_key('ns', 'k')").fetchone()[0]
        assert key == db.admin.execute(
            "SELECT hashtextextended(octet_length('ns')::text || ':' || 'ns' || 'k', 0) AS k"
        ).fetchone()["k"]
        with conn.transaction():
            assert conn.execute("SELECT etc_batch.try_xact_lock('ns', 'k')").fetchone()[0] is True
            conn.execute("SELECT etc_batch.xact_lock('ns', 'k2')")

    for name, kind in tables_of_the_schema(db):
        if kind == "S":
            privileges, check = ("USAGE", "SELECT", "UPDATE"), "has_sequence_privilege"
        else:
            privileges = ("SELECT", "INSERT", "UPDATE", "DELETE", "TRUNCATE", "REFERENCES",
                          "TRIGGER")
            check = "has_table_privilege"
        for privilege in privileges:
            may = db.admin.execute(f"SELECT {check}(%s, %s, %s) AS may",
                                   (nobody, name, privilege)).fetchone()["may"]
            public = name.removeprefix("etc_batch.") in PUBLIC_RELATIONS and privilege == "SELECT"
            assert may is public, (name, privilege)
        if name.removeprefix("etc_batch.") in PUBLIC_RELATIONS and usage:
            # readable, and showing none of the jobs there are
            assert conn.execute(f"SELECT * FROM {name}").fetchall() == []
            continue
        with pytest.raises(errors.InsufficientPrivilege):
            conn.execute(f"SELECT * FROM {name} LIMIT 0")
    with pytest.raises(errors.InsufficientPrivilege):
        conn.execute("SELECT nextval('etc_batch.step_audit_audit_id_seq')")
    with pytest.raises(errors.InsufficientPrivilege):
        conn.execute("INSERT INTO etc_batch.batch_log (id, batch, command, added_by) "
                     "VALUES (999999, 'forged', 'SELECT 1', 'postgres')")
    assert etc_batch_rows(db) == before
    conn.close()


@pytest.mark.parametrize("parallel", [False, True], ids=["in_order", "parallel"])
def test_a_registrant_sees_its_own_jobs_and_no_one_elses(db, roles, parallel):
    """The role that registered a job reads it in job_progress, job_summary and
    job_report with no grant but the one to register; so do its members. Another role
    with the same grants sees nothing of it (42501 from the functions, no row in the
    view); a reader granted SELECT on etc_batch's tables sees every job."""
    clerk, other, member, dashboard = (roles(n) for n in ("clerk", "other", "member", "dash"))
    db.admin.execute(sql.SQL("GRANT {} TO {}").format(ident(clerk), ident(member)))
    tag = secrets.token_hex(3)
    table = f"seen_{tag}"
    db.admin.execute(sql.SQL("CREATE TABLE {} (id int PRIMARY KEY, st text)").format(ident(table)))
    db.admin.execute(sql.SQL("INSERT INTO {} SELECT g, 'p' FROM generate_series(1, 6) g")
                     .format(ident(table)))
    for role in (clerk, other):
        db.admin.execute(sql.SQL("GRANT SELECT, UPDATE ON {} TO {}").format(ident(table), ident(role)))
        db.admin.execute(sql.SQL(
            "GRANT EXECUTE ON FUNCTION etc_batch.register_job(text, text, regclass, jsonb, integer, "
            "jsonb, jsonb, name, name, name, regprocedure, boolean, name[], text, text, boolean, jsonb, text, regclass, boolean, name[]) TO {}")
            .format(ident(role)))
        db.admin.execute(sql.SQL(
            "GRANT EXECUTE ON PROCEDURE etc_batch.drain_job(text, integer, text, text, bigint, "
            "integer, bigint, text, text, text) TO {}").format(ident(role)))
    db.admin.execute(sql.SQL("GRANT SELECT ON TABLE {} TO {}").format(ident(table), ident(dashboard)))
    for role in (clerk, other, member, dashboard):
        db.admin.execute(sql.SQL("GRANT USAGE ON SCHEMA etc_batch TO {}").format(ident(role)))
    db.admin.execute(sql.SQL("GRANT SELECT ON etc_batch.job, etc_batch.job_item, etc_batch.job_audit, "
                             "etc_batch.job_chunk TO {}").format(ident(dashboard)))

    def session(role):
        conn = db.connect()
        conn.execute(sql.SQL("SET ROLE {}").format(ident(role)))
        return conn

    job = {clerk: f"clerk's {tag}", other: f"other's {tag}"}
    for role in (clerk, other):
        conn = session(role)
        conn.execute("SELECT * FROM etc_batch.register_job(%s, NULL, %s::regclass, %s, 2, %s, "
                     "tenant_column => NULL, revision_column => NULL, parallel => %s)",
                     (job[role], table, Jsonb([{"id": i} for i in (1, 2, 3)] if role == clerk
                                              else [{"id": i} for i in (4, 5, 6)]),
                      Jsonb({"st": role[:5]}), parallel))
        assert drain(conn, job[role], 1)["committed_items"] == 2
        conn.close()

    def summary(conn, j):
        return conn.execute("SELECT status, approved, committed, unprocessed, matching "
                            "FROM etc_batch.job_summary(%s)", (j,)).fetchone()

    def report(conn, j):
        return [tuple(r) for r in conn.execute(
            "SELECT item_key, state FROM etc_batch.job_report(%s)", (j,)).fetchall()]

    def progress(conn):
        return {r[0]: r[1:] for r in conn.execute(
            "SELECT job_id, status, committed, approved FROM etc_batch.job_progress "
            "WHERE job_id IN (%s, %s)", (job[clerk], job[other])).fetchall()}

    for role in (clerk, member):
        conn = session(role)
        assert summary(conn, job[clerk]) == ("pending", 3, 2, 1, 2), role
        assert report(conn, job[clerk]) == [("1", "matching"), ("2", "matching"),
                                            ("3", "unprocessed")], role
        assert progress(conn) == {job[clerk]: ("pending", 2, 3)}, role
        for read in (summary, report):
            with pytest.raises(errors.InsufficientPrivilege,
                               match=f'permission denied for job "{job[other]}"'):
                read(conn, job[other])
        conn.close()

    conn = session(dashboard)
    assert summary(conn, job[other]) == ("pending", 3, 2, 1, 2)
    assert report(conn, job[other]) == [("4", "matching"), ("5", "matching"), ("6", "unprocessed")]
    assert progress(conn) == {job[clerk]: ("pending", 2, 3), job[other]: ("pending", 2, 3)}
    conn.close()


def test_a_role_that_may_not_see_a_job_cannot_act_on_it(db, roles):
    """EXECUTE on every routine is not the right to use them on any job: a role that
    may not see a job (it did not register it, is no member of the role that did, and
    has neither SELECT nor UPDATE on etc_batch.job) is refused every routine that takes
    a job id or a launch id with 42501, and the job, its audit, its pause, its pace and
    its running launch stay as they were. A role granted UPDATE on etc_batch.job, and a
    member of the registrant, may act on it."""
    clerk = roles("clerk", "LOGIN")
    intruder, member, runner = (roles(n) for n in ("intruder", "member", "runner"))
    db.admin.execute(sql.SQL("GRANT {} TO {}").format(ident(clerk), ident(member)))
    db.admin.execute(sql.SQL("GRANT UPDATE ON etc_batch.job TO {}").format(ident(runner)))
    table = f"acted_{secrets.token_hex(3)}"
    db.admin.execute(sql.SQL("CREATE TABLE {} (id int PRIMARY KEY, st text)").format(ident(table)))
    db.admin.execute(sql.SQL("INSERT INTO {} SELECT g, 'p' FROM generate_series(1, 8) g")
                     .format(ident(table)))
    for role in (clerk, intruder, member, runner):
        db.admin.execute(sql.SQL("GRANT USAGE ON SCHEMA etc_batch TO {0}; "
                                 "GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA etc_batch TO {0}; "
                                 "GRANT EXECUTE ON ALL PROCEDURES IN SCHEMA etc_batch TO {0}; "
                                 "GRANT SELECT, UPDATE ON {1} TO {0}").format(ident(role), ident(table)))

    def session(role):
        conn = db.connect()
        conn.execute(sql.SQL("SET ROLE {}").format(ident(role)))
        return conn

    clerk_conn = session(clerk)
    job = f"payroll-cut-{secrets.token_hex(3)}"
    register = ("SELECT * FROM etc_batch.register_job(%s, NULL, %s::regclass, %s, 2, %s, "
                "tenant_column => NULL, revision_column => NULL)")
    register_args = (job, table, Jsonb([{"id": i} for i in range(1, 9)]), Jsonb({"st": "done"}))
    clerk_conn.execute(register, register_args)
    assert drain(clerk_conn, job, 1)["committed_items"] == 2
    # a pace whose throttle query always says wait: the launch runs and changes nothing
    clerk_conn.execute("SELECT etc_batch.pace_job(%s, throttle_query => 'SELECT true')", (job,))
    launch = clerk_conn.execute("SELECT launch_id FROM etc_batch.launch_job(%s)", (job,)).fetchone()[0]

    def state():
        return db.admin.execute(
            "SELECT j.status, j.next_index, j.status_reason, j.problem, j.continued_as, j.reverted_by,"
            " (SELECT count(*) FROM etc_batch.job_audit a WHERE a.job_id = j.job_id) AS audit,"
            " (SELECT count(*) FROM etc_batch.job_pause p WHERE p.job_id = j.job_id) AS paused,"
            " (SELECT p.throttle_query FROM etc_batch.job_pace p WHERE p.job_id = j.job_id) AS pace,"
            " (SELECT l.status FROM etc_batch.launch l WHERE l.launch_id = %s) AS launch,"
            " (SELECT count(*) FROM etc_batch.job) AS jobs"
            " FROM etc_batch.job j WHERE j.job_id = %s", (launch, job)).fetchone()

    before = state()
    assert (before["status"], before["next_index"], before["audit"], before["launch"]) == (
        "pending", 2, 2, "running")
    other = f"{job}-again"
    refused = [
        ("drain", "CALL etc_batch.drain_job(%s)", (job,)),
        ("launch", "SELECT * FROM etc_batch.launch_job(%s)", (job,)),
        ("pause", "SELECT etc_batch.pause_job(%s)", (job,)),
        ("resume", "SELECT etc_batch.resume_job(%s)", (job,)),
        ("abort", "SELECT etc_batch.abort_job(%s, 'not mine')", (job,)),
        ("pace", "SELECT etc_batch.pace_job(%s)", (job,)),
        ("verify", "SELECT * FROM etc_batch.verify_job(%s)", (job,)),
        ("continue", "SELECT * FROM etc_batch.register_remainder(%s, %s)", (job, other)),
        ("revert", "SELECT * FROM etc_batch.register_revert(%s, %s)", (job, other)),
        ("preview a revert of", "SELECT * FROM etc_batch.revert_preview(%s)", (job,)),
        ("preview a revert of", "SELECT * FROM etc_batch.revert_preview_left_out(%s)", (job,)),
        ("stop", "SELECT etc_batch.stop_launch(%s)", (launch,)),
        ("summary", "SELECT * FROM etc_batch.job_summary(%s)", (job,)),
        ("report", "SELECT * FROM etc_batch.job_report(%s)", (job,)),
        ("register again", register, register_args),
    ]
    conn = session(intruder)
    for verb, statement, args in refused:
        with pytest.raises(errors.InsufficientPrivilege) as refusal:
            conn.execute(statement, args)
        message = refusal.value.diag.message_primary
        if verb == "stop":
            assert message == f"permission denied to stop launch {launch}", message
        elif verb in ("summary", "report", "register again"):
            assert message == f'permission denied for job "{job}"', message
        else:
            assert message == f'permission denied to {verb} job "{job}"', message
        assert refusal.value.diag.message_detail.startswith("A "), statement
        assert state() == before, statement
    assert conn.execute("SELECT count(*) FROM etc_batch.job_progress WHERE job_id = %s",
                        (job,)).fetchone()[0] == 0
    assert conn.execute("SELECT count(*) FROM etc_batch.launches WHERE launch_id = %s",
                        (launch,)).fetchone()[0] == 0
    conn.close()

    # who may: a role granted UPDATE on etc_batch.job, a member of the registrant
    runner_conn = session(runner)
    runner_conn.execute("SELECT etc_batch.pause_job(%s)", (job,))
    assert state()["paused"] == 1
    runner_conn.execute("SELECT etc_batch.resume_job(%s)", (job,))
    with pytest.raises(errors.InsufficientPrivilege):
        runner_conn.execute("SELECT etc_batch.stop_launch(%s)", (launch,))
    member_conn = session(member)
    assert member_conn.execute("SELECT etc_batch.stop_launch(%s)", (launch,)).fetchone()[0] is True
    member_conn.execute("SELECT etc_batch.pace_job(%s)", (job,))
    # the launch's worker ends, after its wait, before its role is dropped
    for _ in range(300):
        if db.admin.execute("SELECT count(*) AS n FROM pg_stat_activity WHERE usename = %s "
                            "AND backend_type <> 'client backend'", (clerk,)).fetchone()["n"] == 0:
            break
        time.sleep(0.1)
    assert state()["status"] == "pending"
    for c in (runner_conn, member_conn, clerk_conn):
        c.close()


def test_crash_aid_cannot_be_set_by_a_role_that_is_not_superuser(db, roles):
    clerk = roles("clerk", "NOSUPERUSER")
    orders = f"crash_orders_{secrets.token_hex(3)}"
    db.admin.execute(sql.SQL("CREATE TABLE {} (tenant text, id int, revision int, st text, "
                             "PRIMARY KEY (tenant, id))").format(ident(orders)))
    db.admin.execute(sql.SQL("INSERT INTO {} VALUES ('A', 1, 1, 'p'), ('A', 2, 1, 'p')")
                     .format(ident(orders)))
    r = ident(clerk)
    db.admin.execute(sql.SQL("GRANT USAGE ON SCHEMA etc_batch TO {}").format(r))
    db.admin.execute(sql.SQL("GRANT EXECUTE ON ALL ROUTINES IN SCHEMA etc_batch TO {}").format(r))
    db.admin.execute(sql.SQL("GRANT SELECT, UPDATE ON {} TO {}").format(ident(orders), r))

    # before the library is loaded in this session the setting is a mere placeholder,
    # which anyone may set; loading the library must throw it away
    conn = db.connect()
    warnings = []
    conn.add_notice_handler(lambda d: warnings.append(d.message_primary))
    conn.execute(sql.SQL("SET ROLE {}").format(r))
    conn.execute("SET etc_batch.crash_at = 'after_change'")
    job = f"crash {orders}"
    conn.execute("SELECT * FROM etc_batch.register_job(%s, 'A', %s::regclass, %s, 1, %s)",
                 (job, orders, Jsonb([{"id": 1, "revision": 1}, {"id": 2, "revision": 1}]),
                  Jsonb({"st": "x"})))
    assert 'permission denied to set parameter "etc_batch.crash_at"' in warnings
    assert conn.execute("SHOW etc_batch.crash_at").fetchone()[0] == ""
    assert drain(conn, job, 1)["committed_chunks"] == 1

    # once it is loaded, setting it is refused outright
    with pytest.raises(errors.InsufficientPrivilege):
        conn.execute("SET etc_batch.crash_at = 'after_change'")
    assert drain(conn, job)["status"] == "done"
    assert not conn.closed and conn.execute("SELECT 1").fetchone() == (1,)


def test_an_errors_detail_is_for_the_dba_with_rust_backtrace_set(db, roles):
    """The test servers run with RUST_BACKTRACE=1 in their environment (scripts/lib.sh),
    as a DBA's may. A permission error etc_batch raises, and one PostgreSQL raises under
    a chunk, still carry only what a DBA reads: no Rust backtrace in the DETAIL."""
    # what a program the server starts finds in its environment
    db.admin.execute("CREATE TEMP TABLE server_env (value text)")
    db.admin.execute("""COPY server_env FROM PROGRAM 'printf "%s\\n" "$RUST_BACKTRACE"'""")
    assert db.admin.execute("SELECT value FROM server_env").fetchone()["value"] == "1"
    clerk = roles("clerk")
    table = f"bt_{secrets.token_hex(3)}"
    db.admin.execute(sql.SQL("CREATE TABLE {} (id int PRIMARY KEY, st text)").format(ident(table)))
    db.admin.execute(sql.SQL("INSERT INTO {} SELECT g, 'p' FROM generate_series(1, 4) g")
                     .format(ident(table)))
    r = ident(clerk)
    db.admin.execute(sql.SQL("GRANT USAGE ON SCHEMA etc_batch TO {}").format(r))
    db.admin.execute(sql.SQL("GRANT EXECUTE ON ALL ROUTINES IN SCHEMA etc_batch TO {}").format(r))
    db.admin.execute(sql.SQL("GRANT SELECT ON {} TO {}").format(ident(table), r))
    conn = db.connect()
    conn.execute(sql.SQL("SET ROLE {}").format(r))
    register = ("SELECT * FROM etc_batch.register_job(%s, NULL, %s::regclass, %s, 2, %s, "
                "tenant_column => NULL, revision_column => NULL)")
    items = Jsonb([{"id": i} for i in (1, 2, 3, 4)])

    # etc_batch's own: no UPDATE on the target
    with pytest.raises(errors.InsufficientPrivilege) as refused:
        conn.execute(register, ("bt-1", table, items, Jsonb({"st": "x"})))
    diag = refused.value.diag
    assert diag.message_primary == f'permission denied to update column "st" of table {table}'
    assert diag.message_detail == (
        "A job changes rows with the privileges of the role that registers it, which needs "
        "UPDATE on every column the job assigns (and on the revision column, which it "
        "increments).")
    assert diag.message_hint is None

    # PostgreSQL's, under a chunk: UPDATE granted for the registration, then taken away
    db.admin.execute(sql.SQL("GRANT UPDATE ON {} TO {}").format(ident(table), r))
    conn.execute(register, ("bt-2", table, items, Jsonb({"st": "x"})))
    db.admin.execute(sql.SQL("REVOKE UPDATE ON {} FROM {}").format(ident(table), r))
    with pytest.raises(errors.InsufficientPrivilege) as failed:
        drain(conn, "bt-2")
    diag = failed.value.diag
    assert diag.message_primary == f"permission denied for table {table}"
    assert diag.message_detail == 'Chunk 1 of job "bt-2" was rolled back; the job is still pending.'
    assert diag.message_hint == "Fix the cause and call etc_batch.drain_job('bt-2') again."

    # PostgreSQL's, passed on as it was raised: a report read without SELECT on the target
    db.admin.execute(sql.SQL("REVOKE SELECT ON {} FROM {}").format(ident(table), r))
    for report in ("job_summary", "job_report"):
        with pytest.raises(errors.InsufficientPrivilege) as failed:
            conn.execute(f"SELECT * FROM etc_batch.{report}('bt-2')")
        diag = failed.value.diag
        assert diag.message_primary == f"permission denied for table {table}"
        assert diag.message_detail is None
        assert diag.message_hint is None
    conn.close()


def test_the_registering_role_privileges_bound_the_change_whoever_drains(db, roles):
    """A role that may register and drain jobs but may not UPDATE the target cannot get
    the change made. A set_values job it registers is refused at registration
    (test_jobs.py::test_job_changes_rows_as_the_registering_role, and the 'close-x'
    case of tests/pg_regress/sql/jobs.sql); here: the privilege taken away after the
    registration, and handler jobs, which run the handler as the registering role."""
    clerk, intruder = roles("clerk"), roles("intruder")
    orders = f"priv_orders_{secrets.token_hex(3)}"
    db.admin.execute(sql.SQL("CREATE TABLE {} (tenant text, id int, revision int, st text, "
                             "PRIMARY KEY (tenant, id))").format(ident(orders)))
    db.admin.execute(sql.SQL("INSERT INTO {} SELECT 'A', g, 1, 'p' FROM generate_series(1, 6) g")
                     .format(ident(orders)))
    for role in (clerk, intruder):
        r = ident(role)
        db.admin.execute(sql.SQL("GRANT USAGE ON SCHEMA etc_batch TO {}").format(r))
        db.admin.execute(sql.SQL(
            "GRANT EXECUTE ON FUNCTION etc_batch.register_job(text, text, regclass, jsonb, "
            "integer, jsonb, jsonb, name, name, name, regprocedure, boolean, name[], text, text, boolean, jsonb, text, regclass, boolean, name[]) TO {}").format(r))
        db.admin.execute(sql.SQL(
            "GRANT EXECUTE ON PROCEDURE etc_batch.drain_job(text, integer, text, text, bigint, "
            "integer, bigint, text, text, text) TO {}").format(r))
        db.admin.execute(sql.SQL("GRANT SELECT ON {} TO {}").format(ident(orders), r))
    db.admin.execute(sql.SQL("GRANT UPDATE ON {} TO {}").format(ident(orders), ident(clerk)))
    handler = f"priv_handler_{secrets.token_hex(3)}"
    db.admin.execute(sql.SQL(
        """CREATE FUNCTION {fn}(item jsonb) RETURNS jsonb LANGUAGE plpgsql
           SET search_path = pg_catalog, public AS $$
           DECLARE r jsonb;
           BEGIN
             UPDATE {t} AS o SET st = 'handled', revision = o.revision + 1
              WHERE o.tenant = item ->> 'tenant' AND o.id = (item ->> 'id')::int
                AND o.revision = (item ->> 'revision')::int
             RETURNING to_jsonb(o) INTO r;
             RETURN r;
           END $$""").format(fn=ident(handler), t=ident(orders)))
    private = f"{handler}_private"
    db.admin.execute(sql.SQL("CREATE FUNCTION {}(item jsonb) RETURNS jsonb LANGUAGE sql "
                             "AS 'SELECT NULL::jsonb'").format(ident(private)))
    db.admin.execute(sql.SQL("REVOKE EXECUTE ON FUNCTION {}(jsonb) FROM PUBLIC")
                     .format(ident(private)))
    db.admin.execute(sql.SQL("GRANT EXECUTE ON FUNCTION {}(jsonb) TO {}")
                     .format(ident(private), ident(clerk)))

    def as_role(role):
        conn = db.connect()
        conn.execute(sql.SQL("SET ROLE {}").format(ident(role)))
        return conn

    def register(conn, job, ids, handler_name=None):
        args = (job, orders, Jsonb([{"id": i, "revision": 1} for i in ids]))
        if handler_name is None:
            return conn.execute("SELECT * FROM etc_batch.register_job(%s, 'A', %s::regclass, "
                                "%s, 2, '{\"st\": \"x\"}')", args).fetchone()
        return conn.execute("SELECT * FROM etc_batch.register_job(%s, 'A', %s::regclass, %s, 2, "
                            "NULL, handler => %s::regprocedure)",
                            (*args, f"{handler_name}(jsonb)")).fetchone()

    def table():
        return db.admin.execute(sql.SQL("SELECT id, revision, st FROM {} ORDER BY id")
                                .format(ident(orders))).fetchall()

    initial = table()

    # UPDATE taken away after the registration: whoever drains, nothing changes
    job = "revoked 'job'; --"
    register(as_role(clerk), job, [1, 2])
    db.admin.execute(sql.SQL("REVOKE UPDATE ON {} FROM {}").format(ident(orders), ident(clerk)))
    with pytest.raises(errors.InsufficientPrivilege) as refused:
        drain(db.connect(), job)
    assert refused.value.diag.message_hint == (
        f"Fix the cause and call etc_batch.drain_job({quote_literal(db, job)}) again.")
    assert table() == initial
    assert (job_state(db, job)["status"], job_state(db, job)["next_index"]) == ("pending", 0)
    db.admin.execute(sql.SQL("GRANT UPDATE ON {} TO {}").format(ident(orders), ident(clerk)))
    assert drain(db.connect(), job)["status"] == "done"

    # a handler that updates the target, registered by a role without UPDATE on it
    for name, ids, denied in ((handler, [3, 4], f"table {orders}"),
                              (private, [5, 6], f"function {private}")):
        job = f"handler {name}"
        try:
            register(as_role(intruder), job, ids, name)
        except errors.InsufficientPrivilege:
            # refused when it is registered: nothing stored
            assert job_state(db, job) is None
        else:
            with pytest.raises(errors.InsufficientPrivilege) as refused:
                drain(db.connect(), job)
            assert f"permission denied for {denied}" in str(refused.value)
            state = job_state(db, job)
            assert (state["status"], state["next_index"]) == ("pending", 0)
    assert [r for r in table() if r["id"] >= 3] == [r for r in initial if r["id"] >= 3]


def test_an_items_query_reads_with_the_registering_roles_privileges(db, roles):
    """register_job_from_query runs its query as the registering role, with that
    session's search_path: what the role may not read it cannot register (42501, nothing
    stored), row-level security decides which rows become the approval, and an
    unqualified name is the role's own."""
    clerk = roles("clerk")
    tag = secrets.token_hex(3)
    orders, secret, schema = f"q_orders_{tag}", f"q_secret_{tag}", f"q_private_{tag}"
    c = ident(clerk)
    db.admin.execute(sql.SQL("CREATE TABLE {} (tenant text, id int, revision int, st text, "
                             "PRIMARY KEY (tenant, id))").format(ident(orders)))
    db.admin.execute(sql.SQL("INSERT INTO {} SELECT 'A', g, 1, 'p' FROM generate_series(1, 8) g")
                     .format(ident(orders)))
    db.admin.execute(sql.SQL("CREATE TABLE {} (id int, revision int)").format(ident(secret)))
    db.admin.execute(sql.SQL("INSERT INTO {} VALUES (1, 1)").format(ident(secret)))
    db.admin.execute(sql.SQL("GRANT USAGE ON SCHEMA etc_batch TO {}").format(c))
    db.admin.execute(sql.SQL(
        "GRANT EXECUTE ON FUNCTION etc_batch.register_job_from_query(text, text, regclass, text, "
        "integer, jsonb, jsonb, name, name, name, regprocedure, boolean, name[], text, text, boolean, jsonb, text, regclass, boolean, name[]) TO {}").format(c))
    db.admin.execute(sql.SQL("GRANT SELECT, UPDATE ON {} TO {}").format(ident(orders), c))
    # the clerk sees tenant A's orders up to id 5 only
    db.admin.execute(sql.SQL("ALTER TABLE {} ENABLE ROW LEVEL SECURITY").format(ident(orders)))
    db.admin.execute(sql.SQL("CREATE POLICY few ON {} TO {} USING (id <= 5)").format(ident(orders), c))
    # a schema of the clerk's own, with a table named like one the admin has elsewhere
    db.admin.execute(sql.SQL("CREATE SCHEMA {} AUTHORIZATION {}").format(ident(schema), c))
    db.admin.execute(sql.SQL("CREATE TABLE public.{} (id int, revision int)").format(ident(f"picks_{tag}")))
    db.admin.execute(sql.SQL("INSERT INTO public.{} VALUES (7, 1), (8, 1)").format(ident(f"picks_{tag}")))

    conn = db.connect()
    conn.execute(sql.SQL("SET ROLE {}").format(c))

    def register(job, query):
        return conn.execute(
            "SELECT * FROM etc_batch.register_job_from_query(%s, 'A', %s::regclass, %s, 2, "
            "'{\"st\": \"x\"}')", (job, orders, query)).fetchone()

    for label, query in (
        ("a table the role may not read", f"SELECT id, revision FROM {secret}"),
        ("a join with one", f"SELECT o.id, o.revision FROM {orders} o JOIN {secret} s USING (id)"),
    ):
        job = f"denied {label} {tag}"
        with pytest.raises(errors.InsufficientPrivilege) as refused:
            register(job, query)
        assert f"permission denied for table {secret}" in str(refused.value), label
        assert job_state(db, job) is None, label

    # row-level security: the approval is the rows the role may see
    job = f"rls {tag}"
    assert register(job, f"SELECT id, revision FROM {orders} WHERE tenant = 'A'") == (job, True, 5, 3)
    keys = db.admin.execute(
        "SELECT array_agg(item_key ORDER BY position) AS k FROM etc_batch.job_item WHERE job_id = %s",
        (job,)).fetchone()["k"]
    assert keys == ["1", "2", "3", "4", "5"]

    # the role's own search_path: its table shadows the admin's one of the same name
    conn.execute(sql.SQL("CREATE TABLE {}.{} (id int, revision int)").format(
        ident(schema), ident(f"picks_{tag}")))
    conn.execute(sql.SQL("INSERT INTO {}.{} VALUES (2, 1), (4, 1)").format(
        ident(schema), ident(f"picks_{tag}")))
    conn.execute(sql.SQL("SET search_path = {}, public").format(ident(schema)))
    job = f"path {tag}"
    assert register(job, f"SELECT id, revision FROM picks_{tag}") == (job, True, 2, 1)
    keys = db.admin.execute(
        "SELECT array_agg(item_key ORDER BY position) AS k FROM etc_batch.job_item WHERE job_id = %s",
        (job,)).fetchone()["k"]
    assert keys == ["2", "4"]
    conn.execute("RESET search_path")
    conn.execute("RESET ROLE")
    db.admin.execute(sql.SQL("DROP TABLE public.{}").format(ident(f"picks_{tag}")))


def test_set_expressions_cannot_smuggle_statements_reads_or_privileges(db, roles):
    """set_expressions is SQL text a registering role hands etc_batch: what it smuggles
    past one expression (a second statement, a FROM, a subquery reading what the role
    may not read), a function a superuser owns and the role may not execute (plain or
    SECURITY DEFINER), and a column the role may not UPDATE are all refused when the job
    is registered, nothing stored and nothing changed; EXECUTE taken away after the
    registration stops the drain, whoever drains, before anything changes."""
    clerk = roles("clerk")
    tag = secrets.token_hex(3)
    bills, vault = f"x_bills_{tag}", f"x_vault_{tag}"
    plain, definer = f"x_escalate_{tag}", f"x_definer_{tag}"
    c = ident(clerk)
    db.admin.execute(sql.SQL("CREATE TABLE {} (id int PRIMARY KEY, total numeric NOT NULL, "
                             "cents bigint, st text, locked text)").format(ident(bills)))
    db.admin.execute(sql.SQL("INSERT INTO {} SELECT g, g * 1.5, NULL, 'open', 'no' "
                             "FROM generate_series(1, 6) g").format(ident(bills)))
    db.admin.execute(sql.SQL("CREATE TABLE {} (secret text)").format(ident(vault)))
    db.admin.execute(sql.SQL("INSERT INTO {} VALUES ('the key')").format(ident(vault)))
    # a superuser's functions, one of them running with its owner's privileges
    for fn, security in ((plain, ""), (definer, "SECURITY DEFINER")):
        db.admin.execute(sql.SQL(
            "CREATE FUNCTION {}(numeric) RETURNS bigint IMMUTABLE LANGUAGE plpgsql " + security +
            " SET search_path = pg_catalog AS $$ BEGIN RETURN round($1 * 100); END $$")
            .format(ident(fn)))
        db.admin.execute(sql.SQL("REVOKE ALL ON FUNCTION {}(numeric) FROM PUBLIC").format(ident(fn)))
    db.admin.execute(sql.SQL("GRANT USAGE ON SCHEMA etc_batch TO {}").format(c))
    db.admin.execute(sql.SQL(
        "GRANT EXECUTE ON FUNCTION etc_batch.register_job(text, text, regclass, jsonb, "
        "integer, jsonb, jsonb, name, name, name, regprocedure, boolean, name[], text, text, "
        "boolean, jsonb, text, regclass, boolean, name[]) TO {}").format(c))
    db.admin.execute(sql.SQL("GRANT SELECT ON {} TO {}").format(ident(bills), c))
    db.admin.execute(sql.SQL("GRANT UPDATE (cents, st) ON {} TO {}").format(ident(bills), c))

    conn = db.connect()
    conn.execute(sql.SQL("SET ROLE {}").format(c))

    def register(job, expressions):
        return conn.execute(
            "SELECT * FROM etc_batch.register_job(%s, NULL, %s::regclass, %s, 3, NULL, "
            "tenant_column => NULL, revision_column => NULL, set_expressions => %s)",
            (job, bills, Jsonb([{"id": i} for i in range(1, 7)]), Jsonb(expressions))).fetchone()

    def table():
        return db.admin.execute(sql.SQL("SELECT * FROM {} ORDER BY id").format(ident(bills))).fetchall()

    initial = table()
    refusals = (
        ("a second statement", {"cents": f"1); UPDATE {bills} SET st = 'pwned'; SELECT (1"},
         errors.InvalidParameterValue, "must be one expression"),
        ("a statement in a comment's place", {"cents": f"1) -- \n; DELETE FROM {bills}; SELECT (1"},
         errors.InvalidParameterValue, "must be one expression"),
        ("a FROM", {"cents": f"length(secret)) FROM {vault} WHERE (true"},
         errors.InvalidParameterValue, "must be one expression"),
        ("a subquery reading the vault", {"st": f"(SELECT secret FROM {vault} LIMIT 1)"},
         errors.InvalidParameterValue, "must not contain a subquery"),
        ("a superuser's function", {"cents": f"{plain}(total)"},
         errors.InsufficientPrivilege, f"permission denied for function {plain}"),
        ("a superuser's SECURITY DEFINER function", {"cents": f"{definer}(total)"},
         errors.InsufficientPrivilege, f"permission denied for function {definer}"),
        ("a column the role may not update", {"locked": "upper(locked)"},
         errors.InsufficientPrivilege, f"permission denied to update column \"locked\""),
    )
    for label, expressions, error, message in refusals:
        job = f"smuggle {label} {tag}"
        with pytest.raises(error) as refused:
            register(job, expressions)
        assert message in str(refused.value), label
        assert job_state(db, job) is None, label
    assert table() == initial
    assert db.admin.execute(sql.SQL("SELECT secret FROM {}").format(ident(vault))).fetchone() == {
        "secret": "the key"}

    # granted, registered, then taken away: a superuser's drain runs the expression as
    # the clerk, and it is refused before any row changes
    db.admin.execute(sql.SQL("GRANT EXECUTE ON FUNCTION {}(numeric) TO {}").format(ident(plain), c))
    job = f"revoked expression {tag}"
    assert register(job, {"cents": f"{plain}(total)"}) == (job, True, 6, 2)
    db.admin.execute(sql.SQL("REVOKE EXECUTE ON FUNCTION {}(numeric) FROM {}").format(ident(plain), c))
    with pytest.raises(errors.InsufficientPrivilege) as refused:
        drain(db.connect(), job)
    assert f"permission denied for function {plain}" in str(refused.value)
    assert table() == initial
    assert (job_state(db, job)["status"], job_state(db, job)["next_index"]) == ("pending", 0)
    db.admin.execute(sql.SQL("GRANT EXECUTE ON FUNCTION {}(numeric) TO {}").format(ident(plain), c))
    assert drain(db.connect(), job)["status"] == "done"
    assert [r["cents"] for r in table()] == [150, 300, 450, 600, 750, 900]
    conn.execute("RESET ROLE")
