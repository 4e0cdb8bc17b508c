"""Hostile input to etc_batch.register_job over a real connection: malformed items,
set_values and expect, mixed and colliding key types, numbers beyond every integer type
and beyond double precision, nesting far deeper than any approval needs, duplicate keys
and duplicate field names, NUL and surrogate escapes, hostile column names, long lists
with one bad element at the very end, and a seeded stream of random malformed
approvals.

Every case must be refused with a specific SQLSTATE (never XX000, the class of internal
errors, and never a lost connection), leave the calling connection usable in the same
backend, leave every other backend and the postmaster as they were, and store nothing
under its job id. A valid registration still works afterwards, and the business table
is untouched throughout.

The SQLSTATEs seen, per class of input, are printed when the module ends. The random
stream's seed is printed with them and named in every failure; HOSTILE_SEED replays it.
"""

import json
import os
import random
import secrets
from collections import Counter, defaultdict

import psycopg
import pytest
from psycopg import sql

# class of input -> Counter of SQLSTATEs; printed when the module ends
SEEN = defaultdict(Counter)

SEED = int(os.environ.get("HOSTILE_SEED") or secrets.randbits(32))
RANDOM_CASES = 300

CANCEL = {"status": "cancelled"}
VALID_ITEMS = [{"id": 3, "revision": 4, "qty": 4}, {"id": 5, "revision": 2, "qty": 6}]

INVALID = {"22023"}  # invalid_parameter_value: what etc_batch raises for a bad argument
NO_COLUMN = {"42703"}
NOT_UNIQUE = {"42P10"}  # invalid_column_reference: a key no unique index has
NULL = {"22004"}
JSON_SYNTAX = {"22P02"}
NUL = {"22P05"}  # jsonb cannot hold \u0000
# jsonb's own parser refuses nesting past max_stack_depth; below that etc_batch does
DEEP = {"22023", "54001"}


class Raw(str):
    """JSON text sent as it is: duplicate field names, bare NaN, exact nesting."""


def jtext(value):
    """JSON text of value, with Raw parts at any depth sent as they are."""
    if isinstance(value, Raw):
        return str(value)
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(k)}: {jtext(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(jtext(v) for v in value) + "]"
    return json.dumps(value)


def nested(depth, inner="1", objects=False):
    """JSON text of `inner` nested `depth` levels deep, as arrays or objects."""
    if objects:
        return Raw('{"a": ' * depth + inner + "}" * depth)
    return Raw("[" * depth + inner + "]" * depth)


def one(**fields):
    """items: one item, key 3 at revision 4, with these fields."""
    return [{"id": 3, "revision": 4, **fields}]


def one_raw(fields):
    """items as JSON text: one item, key 3 at revision 4, with these fields as text."""
    return Raw('[{"id": 3, "revision": 4, ' + fields + "}]")


# The arguments of register_job, in order, with the casts that bind them; a request is
# a dict of the arguments to pass, where None is SQL NULL.
ARGS = [
    ("job_id", "%s::text"),
    ("tenant", "%s::text"),
    ("target", "%s::regclass"),
    ("items", "%s::jsonb"),
    ("chunk_size", "%s::integer"),
    ("set_values", "%s::jsonb"),
    ("expect", "%s::jsonb"),
    ("key_column", "%s::name"),
    ("tenant_column", "%s::name"),
    ("revision_column", "%s::name"),
    ("handler", "%s::regprocedure"),
    ("key_columns", "%s::name[]"),
    ("guard", "%s::text"),
    ("on_drift", "%s::text"),
]
JSONB_ARGS = {"items", "set_values", "expect"}


def statement(request):
    parts, params = [], []
    for name, placeholder in ARGS:
        if name not in request:
            continue
        value = request[name]
        if name in JSONB_ARGS and value is not None:
            value = jtext(value)
        parts.append(f"{name} => {placeholder}")
        params.append(value)
    return "SELECT * FROM etc_batch.register_job(" + ", ".join(parts) + ")", params


def job_id(label):
    return f"hostile_{label}_{secrets.token_hex(4)}"


class Hostile:
    """The module's tables, its witnesses of a crash, and the checks every refused
    registration must pass."""

    def __init__(self, db):
        self.db = db
        tag = secrets.token_hex(3)
        self.orders = f"orders_{tag}"
        self.texts = f"texts_{tag}"
        self.uuids = f"uuids_{tag}"
        self.numbered = f"numbered_{tag}"
        self.view = f"view_{tag}"
        self.sequence = f"seq_{tag}"
        self.run(
            """CREATE TABLE {orders} (
                   tenant text NOT NULL, id integer NOT NULL, revision integer NOT NULL,
                   qty integer, status text NOT NULL DEFAULT 'pending', price numeric,
                   due date, flag boolean, ref uuid, doc jsonb, big bigint,
                   PRIMARY KEY (tenant, id))"""
        )
        self.run(
            "INSERT INTO {orders} (tenant, id, revision, qty, price) "
            "SELECT 'A', i, 1 + i % 4, 1 + i % 9, i * 1.25 FROM generate_series(1, 60) i"
        )
        self.run(
            "CREATE TABLE {texts} (tenant text NOT NULL, id text NOT NULL, "
            "revision bigint NOT NULL, status text, PRIMARY KEY (tenant, id))"
        )
        self.run(
            "CREATE TABLE {uuids} (tenant text NOT NULL, id uuid NOT NULL, "
            "revision integer NOT NULL, status text, PRIMARY KEY (tenant, id))"
        )
        self.run(
            "CREATE TABLE {numbered} (tenant integer NOT NULL, id bigint NOT NULL, "
            "revision bigint NOT NULL, status text, PRIMARY KEY (tenant, id))"
        )
        self.run("CREATE VIEW {view} AS SELECT * FROM {orders}")
        self.run("CREATE SEQUENCE {sequence}")
        self.initial = self.snapshot()
        self.admin_pid = db.admin.info.backend_pid
        self.started = db.admin.execute("SELECT pg_postmaster_start_time() AS t").fetchone()["t"]
        self.refused = 0

    def run(self, statement):
        names = ("orders", "texts", "uuids", "numbered", "view", "sequence")
        return self.db.admin.execute(
            sql.SQL(statement).format(**{n: sql.Identifier(getattr(self, n)) for n in names})
        )

    def snapshot(self):
        return self.run("SELECT t::text AS row FROM {orders} t ORDER BY id").fetchall()

    def request(self, job, **changes):
        request = {
            "job_id": job,
            "tenant": "A",
            "target": self.orders,
            "items": VALID_ITEMS,
            "chunk_size": 10,
            "set_values": CANCEL,
        }
        request.update(changes)
        return request

    def assert_intact(self, what):
        """No backend crashed: the module's first connection is the same backend and
        the postmaster has not restarted."""
        row = self.db.admin.execute(
            "SELECT pg_backend_pid() AS pid, pg_postmaster_start_time() AS t"
        ).fetchone()
        assert (row["pid"], row["t"]) == (self.admin_pid, self.started), (
            f"the server restarted or the witness backend died after {what}"
        )

    def stored(self, job):
        row = self.db.admin.execute(
            """SELECT (SELECT count(*) FROM etc_batch.job WHERE job_id = %s) AS jobs,
                      (SELECT count(*) FROM etc_batch.job_item WHERE job_id = %s) AS items""",
            (job, job),
        ).fetchone()
        return row["jobs"], row["items"]

    def refuse(self, conn, kind, request, allowed, named=None, cls=None):
        """register_job(request) on conn must fail with one of the allowed SQLSTATEs
        and change nothing; returns the error. The SQLSTATE is counted under cls, by
        default the part of kind before its colon."""
        what = f"{kind} (seed {SEED})"
        pid = conn.info.backend_pid
        text, params = statement(request)
        try:
            conn.execute(text, params)
        except psycopg.Error as e:
            error = e
        else:
            pytest.fail(f"{what}: registered instead of refused: {text} {str(params)[:300]}")
        code = error.sqlstate
        SEEN[cls or kind.split(":")[0]][code] += 1
        shown = f"{what}: SQLSTATE {code}: {str(error)[:500]}"
        assert code is not None, f"no SQLSTATE, the connection was lost: {shown}"
        assert not code.startswith("XX"), f"internal error: {shown}"
        assert code in allowed, f"expected one of {sorted(allowed)}: {shown}"
        if named is not None:
            assert named in str(error), shown
        # the same backend goes on working: autocommit, so no transaction is left aborted
        assert not conn.broken and not conn.closed, shown
        assert conn.execute("SELECT pg_backend_pid()").fetchone()[0] == pid, shown
        self.assert_intact(what)
        job = request.get("job_id")
        if job is not None:
            assert self.stored(job) == (0, 0), f"{what}: something was stored for {job!r}"
        self.refused += 1
        return error


@pytest.fixture(scope="module")
def hostile(db, request):
    h = Hostile(db)
    yield h
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    if reporter is None or capture is None:
        return
    # fixture teardown output is captured (and dropped on success) unless let through
    with capture.global_and_fixture_disabled():
        reporter.write_line("")
        reporter.write_line(
            f"hostile input, seed {SEED}: {h.refused} refusals; SQLSTATEs by input class:"
        )
        for kind in sorted(SEEN):
            codes = ", ".join(f"{c} x{n}" for c, n in sorted(SEEN[kind].items(), key=str))
            reporter.write_line(f"  {kind}: {codes}")


# fixed cases: (class: label, changes to the valid request, allowed SQLSTATEs) ---------------

DEPTH = 10_000

CASES = [
    # items that are not a list of objects
    ("items not a list: object", {"items": {"id": 3, "revision": 4}}, INVALID),
    ("items not a list: number", {"items": 1}, INVALID),
    ("items not a list: string", {"items": '[{"id": 3, "revision": 4}]'}, INVALID),
    ("items not a list: true", {"items": True}, INVALID),
    ("items not a list: json null", {"items": Raw("null")}, INVALID),
    ("items not a list: sql null", {"items": None}, NULL),
    ("items of non-objects: number", {"items": [1]}, INVALID),
    ("items of non-objects: string", {"items": ["a"]}, INVALID),
    ("items of non-objects: null", {"items": [None]}, INVALID),
    ("items of non-objects: empty list", {"items": [[]]}, INVALID),
    ("items of non-objects: nested list", {"items": [VALID_ITEMS]}, INVALID),
    ("items of non-objects: one among objects", {"items": VALID_ITEMS + [7]}, INVALID),
    # keys
    ("key missing", {"items": [{"revision": 4}]}, INVALID),
    ("key null", {"items": one(id=None)}, INVALID),
    ("key type: string", {"items": one(id="3")}, INVALID),
    ("key type: fraction", {"items": one(id=3.5)}, INVALID),
    ("key type: 3.0", {"items": one(id=3.0)}, INVALID),
    ("key type: boolean", {"items": one(id=True)}, INVALID),
    ("key type: list", {"items": one(id=[3])}, INVALID),
    ("key type: object", {"items": one(id={"v": 3})}, INVALID),
    ("key type: mixed", {"items": VALID_ITEMS + [{"id": "7", "revision": 2}]}, INVALID),
    ("key type: NaN string", {"items": one(id="NaN")}, INVALID),
    ("key type: Infinity string", {"items": one(id="Infinity")}, INVALID),
    ("key type: unicode digit", {"items": one(id="\u0663")}, INVALID),
    ("key range: int4 + 1", {"items": one(id=2**31)}, INVALID),
    ("key range: beyond bigint", {"items": one(id=2**63)}, INVALID),
    ("key range: beyond uint64", {"items": one(id=2**64 + 1)}, INVALID),
    ("key range: below bigint", {"items": one(id=-(2**63) - 1)}, INVALID),
    ("key range: 400 digits", {"items": one(id=10**400)}, INVALID),
    ("key range: 1e400", {"items": Raw('[{"id": 1e400, "revision": 4}]')}, INVALID),
    ("key range: 1e-400", {"items": Raw('[{"id": 1e-400, "revision": 4}]')}, INVALID),
    ("key range: 100001 digits", {"items": Raw('[{"id": 1e100000, "revision": 4}]')}, INVALID),
    # beyond what numeric holds, jsonb refuses it itself
    ("key range: 1e1000000", {"items": Raw('[{"id": 1e1000000, "revision": 4}]')}, {"22003"}),
    ("key syntax: bare NaN", {"items": Raw('[{"id": NaN, "revision": 4}]')}, JSON_SYNTAX),
    ("key syntax: bare Infinity", {"items": Raw('[{"id": Infinity, "revision": 4}]')},
     JSON_SYNTAX),
    ("key syntax: hex", {"items": Raw('[{"id": 0x10, "revision": 4}]')}, JSON_SYNTAX),
    # revisions
    ("revision missing", {"items": [{"id": 3}]}, INVALID),
    ("revision type: string", {"items": one(revision="4")}, INVALID),
    ("revision type: null", {"items": one(revision=None)}, INVALID),
    ("revision type: fraction", {"items": one(revision=4.5)}, INVALID),
    ("revision range: int4 + 1", {"items": one(revision=2**31)}, INVALID),
    ("revision range: 400 digits", {"items": one(revision=-(10**400))}, INVALID),
    # guards and other fields
    ("guard column unknown", {"items": one(colour="red")}, NO_COLUMN),
    ("guard column empty name", {"items": one(**{"": 1})}, NO_COLUMN),
    ("guard column quote", {"items": one(**{'qty" = qty OR true --': 1})}, NO_COLUMN),
    ("guard column unicode", {"items": one(**{"gr\u00f6\u00dfe": 1})}, NO_COLUMN),
    ("guard column case", {"items": one(QTY=1)}, NO_COLUMN),
    ("guard column tenant", {"items": one(tenant="A")}, INVALID),
    ("guard type: int from string", {"items": one(qty="two")}, INVALID),
    ("guard type: int from fraction", {"items": one(qty=1.5)}, INVALID),
    ("guard range: int4 + 1", {"items": one(qty=2**31)}, INVALID),
    ("guard range: bigint + 1", {"items": one(big=2**63)}, INVALID),
    ("guard range: int beyond every integer", {"items": one(qty=10**400)}, INVALID),
    ("guard range: int -1e309", {"items": one_raw('"qty": -1e309')}, INVALID),
    ("guard type: numeric NaN string", {"items": one(price="NaN")}, INVALID),
    ("guard type: date garbage", {"items": one(due="not a date")}, INVALID),
    ("guard type: date Feb 30", {"items": one(due="2023-02-30")}, INVALID),
    ("guard type: date NaN", {"items": one(due="NaN")}, INVALID),
    ("guard type: date number", {"items": one(due=1e300)}, INVALID),
    ("guard type: bool string", {"items": one(flag="true")}, INVALID),
    ("guard type: uuid garbage", {"items": one(ref="not-a-uuid")}, INVALID),
    ("guard type: jsonb object", {"items": one(doc={"a": 1})}, INVALID),
    ("guard type: jsonb garbage", {"items": one(doc="{")}, INVALID),
    ("guard type: text list", {"items": one(status=["x"])}, INVALID),
    # duplicates
    ("duplicate key: same", {"items": VALID_ITEMS + one()}, INVALID),
    ("duplicate key: 3 and '3'", {"items": VALID_ITEMS + one(id="3")}, INVALID),
    ("duplicate key: 3 and 3.0", {"items": VALID_ITEMS + one(id=3.0)}, INVALID),
    ("duplicate key: 3 and 3e0",
     {"items": Raw('[{"id": 3, "revision": 4}, {"id": 3e0, "revision": 4}]')}, INVALID),
    ("duplicate field: last is bad", {"items": Raw('[{"id": 3, "revision": 4, "id": "x"}]')},
     INVALID),
    ("duplicate field: last repeats a key",
     {"items": Raw('[{"id": "x", "revision": 4, "id": 5}, {"id": 5, "revision": 2}]')}, INVALID),
    # nesting
    (f"deep: items {DEPTH} lists", {"items": nested(DEPTH)}, DEEP),
    (f"deep: items {DEPTH} objects", {"items": nested(DEPTH, objects=True)}, DEEP),
    (f"deep: guard {DEPTH} lists", {"items": one_raw('"qty": ' + nested(DEPTH))}, DEEP),
    (f"deep: key {DEPTH} objects",
     {"items": Raw('[{"revision": 4, "id": ' + nested(DEPTH, objects=True) + "}]")}, DEEP),
    (f"deep: set_values {DEPTH}", {"set_values": {"status": nested(DEPTH)}}, DEEP),
    (f"deep: expect {DEPTH}", {"expect": {"status": nested(DEPTH, objects=True)}}, DEEP),
    # just past what the JSON reader nests, and well below what jsonb refuses
    ("deep: items 128", {"items": nested(128)}, INVALID),
    ("deep: items 129 objects", {"items": nested(129, objects=True)}, INVALID),
    ("deep: items 1000", {"items": nested(1000)}, INVALID),
    ("deep: guard 200", {"items": one_raw('"qty": ' + nested(200))}, INVALID),
    ("deep: guard 100", {"items": one_raw('"qty": ' + nested(100))}, INVALID),
    ("deep: set_values 200", {"set_values": {"status": nested(200)}}, INVALID),
    ("deep: expect 200", {"expect": {"qty": nested(200, objects=True)}}, INVALID),
    # escapes and syntax
    ("escape: NUL", {"items": one_raw('"status": "a\\u0000b"')}, NUL),
    ("escape: NUL in a field name", {"items": one_raw('"st\\u0000atus": "x"')}, NUL),
    ("escape: lone surrogate", {"items": one_raw('"status": "\\ud800"')}, JSON_SYNTAX),
    ("escape: reversed surrogates", {"items": one_raw('"status": "\\udc00\\ud800"')},
     JSON_SYNTAX),
    ("syntax: trailing comma", {"items": Raw('[{"id": 3, "revision": 4},]')}, JSON_SYNTAX),
    ("syntax: single quotes", {"items": Raw("[{'id': 3, 'revision': 4}]")}, JSON_SYNTAX),
    ("syntax: truncated", {"items": Raw('[{"id": 3, "revision": 4}')}, JSON_SYNTAX),
    ("syntax: empty text", {"items": Raw("")}, JSON_SYNTAX),
    # set_values
    ("set_values missing: sql null", {"set_values": None}, INVALID),
    ("set_values missing: json null", {"set_values": Raw("null")}, INVALID),
    ("set_values not an object: list", {"set_values": [CANCEL]}, INVALID),
    ("set_values not an object: string", {"set_values": "cancelled"}, INVALID),
    ("set_values empty", {"set_values": {}}, INVALID),
    ("set_values column unknown", {"set_values": {"colour": "red"}}, NO_COLUMN),
    ("set_values column empty name", {"set_values": {"": "x"}}, NO_COLUMN),
    ("set_values assigns the key", {"set_values": {"status": "x", "id": 9}}, INVALID),
    ("set_values assigns the tenant", {"set_values": {"tenant": "B"}}, INVALID),
    ("set_values assigns the revision", {"set_values": {"revision": 1}}, INVALID),
    ("set_values type", {"set_values": {"status": 5}}, INVALID),
    ("set_values range: int4 + 1", {"set_values": {"qty": 2**31}}, INVALID),
    ("set_values range: 400 digits", {"set_values": {"qty": 10**400}}, INVALID),
    ("set_values date garbage", {"set_values": {"due": "never"}}, INVALID),
    ("set_values and a handler", {"handler": "pg_catalog.jsonb_strip_nulls(jsonb)"}, INVALID),
    # expect
    ("expect missing: sql null", {"expect": None}, NULL),
    ("expect not an object: json null", {"expect": Raw("null")}, INVALID),
    ("expect not an object: list", {"expect": [{"status": "pending"}]}, INVALID),
    ("expect column unknown", {"expect": {"colour": "red"}}, NO_COLUMN),
    ("expect type", {"expect": {"qty": "x"}}, INVALID),
    ("expect range: 400 digits", {"expect": {"big": -(10**400)}}, INVALID),
    # column names
    ("key_column unknown", {"key_column": "nope"}, NO_COLUMN),
    ("key_column empty", {"key_column": ""}, NO_COLUMN),
    ("key_column injection", {"key_column": 'id"; DROP TABLE x; --'}, NO_COLUMN),
    ("key_column too long", {"key_column": "id" * 100}, NO_COLUMN),
    ("key_column numeric without a unique index", {"key_column": "price"}, NOT_UNIQUE),
    ("key_column without a unique index",
     {"key_column": "status", "items": [{"status": "x", "revision": 1}],
      "set_values": {"qty": 1}}, NOT_UNIQUE),
    ("key_column and key_columns", {"key_column": "id", "key_columns": ["id"]}, INVALID),
    ("key_columns empty", {"key_columns": []}, INVALID),
    ("key_columns twice the same", {"key_columns": ["id", "id"]}, INVALID),
    ("key_columns unknown", {"key_columns": ["id", "nope"]}, NO_COLUMN),
    ("key_column is the revision column", {"revision_column": "id", "items": [{"id": 3}]},
     INVALID),
    ("key_column is the tenant column", {"tenant_column": "id"}, INVALID),
    ("tenant_column unknown", {"tenant_column": "nope"}, NO_COLUMN),
    ("tenant_column null with a tenant", {"tenant_column": None}, INVALID),
    ("revision_column unknown", {"revision_column": "nope"}, NO_COLUMN),
    ("revision_column text", {"revision_column": "status"}, INVALID),
    ("revision_column numeric", {"revision_column": "price"}, INVALID),
    ("revision_column is the tenant column", {"revision_column": "tenant"}, INVALID),
    ("revision_column null, guard revision", {"revision_column": None, "guard": "revision"},
     INVALID),
    ("guard unknown", {"guard": "digest"}, INVALID),
    ("on_drift unknown", {"on_drift": "ignore"}, INVALID),
    ("on_drift null", {"on_drift": None}, NULL),
    ("job id too long", {"job_id": "j" * 201}, INVALID),
    # the other arguments
    ("job_id null", {"job_id": None}, NULL),
    ("job_id empty", {"job_id": ""}, INVALID),
    ("job_id blank", {"job_id": " \t\n"}, INVALID),
    # a job id is a primary key: one too long for a btree entry is refused before
    # anything is written, at the documented length
    ("job_id too long for an index", {"job_id": "hostile_" + secrets.token_hex(8000)}, INVALID),
    ("job_id of 201 bytes", {"job_id": "é" * 100 + "j"}, INVALID),
    # no tenant: a job on the whole table, keyed by its primary key (tenant, id), which
    # these items do not name in full
    ("tenant null", {"tenant": None}, INVALID),
    ("chunk_size zero", {"chunk_size": 0}, INVALID),
    ("chunk_size negative", {"chunk_size": -(2**31)}, INVALID),
    ("chunk_size beyond integer", {"chunk_size": 2**31}, {"22003"}),
    ("chunk_size null", {"chunk_size": None}, NULL),
    ("target null", {"target": None}, NULL),
    ("target oid 0", {"target": "0"}, {"42P01"}),  # undefined_table
    ("target unknown oid", {"target": "4000000000"}, {"42P01"}),
    ("target unknown name", {"target": "no_such_table_hostile"}, {"42P01"}),
    ("target name injection", {"target": "x; DROP TABLE y"}, {"42602"}),
    ("handler with the wrong signature",
     {"set_values": None, "handler": "pg_catalog.abs(integer)"}, INVALID),
    # a regprocedure given as a number names no function: undefined_function
    ("handler unknown oid", {"set_values": None, "handler": "4000000000"}, {"42883"}),
]


@pytest.mark.parametrize("kind, changes, allowed", CASES, ids=[c[0] for c in CASES])
def test_hostile_argument_is_refused_cleanly(db, hostile, kind, changes, allowed):
    conn = db.connect()
    hostile.refuse(conn, kind, hostile.request(job_id("case"), **changes), allowed)
    # the connection that saw the error registers a valid approval right after it
    good = job_id("after")
    assert conn.execute(*statement(hostile.request(good))).fetchone() == (good, True, 2, 1)
    assert hostile.stored(good) == (1, 2)


def test_other_targets_and_key_types(db, hostile):
    conn = db.connect()
    uuid = "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"
    cases = [
        ("target: view", {"target": hostile.view}, INVALID),
        ("target: sequence", {"target": hostile.sequence}, INVALID),
        ("tenant of the wrong type",
         {"target": hostile.numbered, "tenant": "A", "items": one()}, INVALID),
        ("key range: bigint + 1",
         {"target": hostile.numbered, "tenant": "1", "items": one(id=2**63)}, INVALID),
        ("duplicate key: text",
         {"target": hostile.texts, "items": one(id="k") + one(id="k", revision=2)}, INVALID),
        ("key type: number for text", {"target": hostile.texts, "items": one()}, INVALID),
        ("duplicate key: one uuid spelled three ways",
         {"target": hostile.uuids,
          "items": one(id=uuid) + one(id="{" + uuid.upper() + "}") + one(id=uuid.replace("-", ""))},
         INVALID),
        ("key type: uuid one digit short", {"target": hostile.uuids, "items": one(id=uuid[:-1])},
         INVALID),
    ]
    for kind, changes, allowed in cases:
        hostile.refuse(conn, kind, hostile.request(job_id("kinds"), **changes), allowed)


def test_a_long_list_with_one_bad_element_at_the_end(db, hostile):
    conn = db.connect()
    body = ", ".join(f'{{"id": {i}, "revision": 1, "qty": {i % 7}}}' for i in range(1, 100_001))
    last = '{"id": 100001, "revision": 1, '
    tails = [
        ("wrong key type", '{"id": "100001", "revision": 1}', INVALID, "item 100001"),
        ("non-object", "7", INVALID, "item 100001"),
        ("duplicate of the first", '{"id": 1, "revision": 1}', INVALID, "Key 1 "),
        ("unknown column", last + '"colour": 1}', NO_COLUMN, "colour"),
        ("too deep", last + '"qty": ' + nested(300) + "}", INVALID, "nested too deeply"),
        ("huge number", last + '"qty": 1e400}', INVALID, "item 100001"),
        ("NUL", last + '"status": "\\u0000"}', NUL, None),
    ]
    for kind, tail, allowed, named in tails:
        request = hostile.request(job_id("long"), items=Raw(f"[{body}, {tail}]"))
        hostile.refuse(conn, f"long list: {kind} last", request, allowed, named)


def test_duplicate_field_names_keep_the_last_as_jsonb_does(db, hostile):
    """Not an error: jsonb keeps the last of duplicate field names, and so does the
    approval; the values that were dropped are nowhere in what is stored."""
    conn = db.connect()
    job = job_id("dupfield")
    items = Raw('[{"id": "x", "revision": 9, "id": 5, "qty": "bad", "revision": 2, "qty": 6}]')
    assert conn.execute(*statement(hostile.request(job, items=items))).fetchone() == (
        job, True, 1, 1)
    stored = hostile.db.admin.execute(
        "SELECT item_key, revision, guards FROM etc_batch.job_item WHERE job_id = %s", (job,)
    ).fetchall()
    assert [tuple(r.values()) for r in stored] == [("5", 2, {"qty": 6})]


# random malformed approvals -------------------------------------------------------------------


def random_json_text(rng, value):
    """JSON text of value with random spacing, and now and then a field given twice,
    first with junk: jsonb keeps the last, so the meaning does not change."""
    def space():
        return rng.choice(["", " ", "\n", "\t ", "  "])

    if isinstance(value, Raw):
        return str(value)
    if isinstance(value, dict):
        fields = []
        for k, v in value.items():
            if rng.random() < 0.1:
                junk = rng.choice(['"junk"', "[1, 2]", "null", "1e400", "{}"])
                fields.append(f"{json.dumps(k)}{space()}:{space()}{junk}")
            fields.append(f"{json.dumps(k)}{space()}:{space()}{random_json_text(rng, v)}")
        return "{" + space() + ("," + space()).join(fields) + space() + "}"
    if isinstance(value, list):
        inner = ("," + space()).join(random_json_text(rng, v) for v in value)
        return "[" + space() + inner + space() + "]"
    return json.dumps(value)


def random_valid_request(rng, hostile, job):
    items = []
    for i in rng.sample(range(1, 61), rng.randint(1, 25)):
        item = {"id": i, "revision": rng.randint(-5, 2**31 - 1)}
        for column, value in [
            ("qty", rng.randint(-(2**31), 2**31 - 1)),
            ("status", rng.choice(["pending", "", "\u00e9\u00e8", "\U0001F600", 'a"b\\c', "\t"])),
            ("price", rng.choice([0, 1.25, -7, 12345.678, 10**15])),
            ("flag", rng.choice([True, False, None])),
            ("due", rng.choice(["2024-02-29", "infinity", None])),
            ("ref", rng.choice(["a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11", None])),
            ("big", rng.randint(-(2**63), 2**63 - 1)),
        ]:
            if rng.random() < 0.3:
                item[column] = value
        items.append(item)
    return hostile.request(job, items=items, chunk_size=rng.randint(1, 30))


def some_item(rng, request):
    return rng.choice([i for i in request["items"] if isinstance(i, dict)])


def junk_name(rng):
    """A column name no target has, with quotes, backslashes and unicode in it."""
    chars = 'abc"\\\' ;-\u00e9\U0001F600$'
    return "x_" + "".join(rng.choice(chars) for _ in range(rng.randint(0, 8)))


def huge_number(rng):
    return Raw(rng.choice(["", "-"]) + "1e" + str(rng.randint(309, 5000)))


def deep_value(rng):
    return nested(rng.randint(128, 3000), objects=rng.random() < 0.5)


# Each breaker makes the request invalid and returns (class, allowed SQLSTATEs).


def b_key(rng, r):
    some_item(rng, r)["id"] = rng.choice([
        "3", 3.5, True, None, [3], {}, "NaN", "", 2**31 + rng.randint(0, 2**40),
        2**63 + rng.randint(0, 2**40), -(2**63) - 1 - rng.randint(0, 99), huge_number(rng),
    ])
    return "random: key", INVALID


def b_missing(rng, r):
    del some_item(rng, r)[rng.choice(["id", "revision"])]
    return "random: key or revision missing", INVALID


def b_revision(rng, r):
    some_item(rng, r)["revision"] = rng.choice(
        ["1", 1.5, None, [1], 2**31, -(2**31) - 1, huge_number(rng)])
    return "random: revision", INVALID


def b_unknown_column(rng, r):
    some_item(rng, r)[junk_name(rng)] = rng.choice([1, "x", None])
    return "random: unknown column", NO_COLUMN


def b_tenant(rng, r):
    some_item(rng, r)["tenant"] = "A"
    return "random: tenant in an item", INVALID


def b_guard(rng, r):
    column, value = rng.choice([
        ("qty", "x"), ("qty", 1.5), ("qty", 2**31), ("qty", True), ("qty", [1]),
        ("qty", {"a": 1}), ("status", 1), ("status", True), ("status", []), ("price", "1"),
        ("price", True), ("qty", huge_number(rng)), ("due", "not a date"),
        ("due", "2023-02-30"), ("due", "NaN"), ("flag", "yes"), ("flag", 1), ("ref", "nope"),
        ("ref", 1), ("big", 2**63), ("doc", "x"),
    ])
    some_item(rng, r)[column] = value
    return "random: guard", INVALID


def b_duplicate(rng, r):
    twin = dict(some_item(rng, r))
    twin["revision"] = rng.randint(0, 9)
    r["items"].insert(rng.randint(0, len(r["items"])), twin)
    return "random: duplicate key", INVALID


def b_non_object(rng, r):
    stranger = rng.choice([1, "x", None, True, [], [{"id": 1, "revision": 1}]])
    r["items"].insert(rng.randint(0, len(r["items"])), stranger)
    return "random: non-object item", INVALID


def b_deep(rng, r):
    some_item(rng, r)[rng.choice(["id", "revision", "qty", "status"])] = deep_value(rng)
    return "random: deep nesting", DEEP


def b_items(rng, r):
    # (an empty list is an approval of nothing, a job done at once: not hostile)
    r["items"] = rng.choice([{}, 1, "x", Raw("null"), deep_value(rng), huge_number(rng)])
    return "random: items not a list", DEEP


def b_set_values(rng, r):
    r["set_values"], codes = rng.choice([
        ([], INVALID), ("x", INVALID), ({}, INVALID), ({junk_name(rng): 1}, NO_COLUMN),
        ({"id": 1}, INVALID), ({"status": 5}, INVALID), ({"big": huge_number(rng)}, INVALID),
        ({"status": deep_value(rng)}, INVALID), (None, INVALID),
    ])
    return "random: set_values", codes


def b_expect(rng, r):
    r["expect"], codes = rng.choice([
        ([], INVALID), (Raw("null"), INVALID), ({junk_name(rng): 1}, NO_COLUMN),
        ({"qty": "x"}, INVALID), ({"qty": deep_value(rng)}, INVALID),
    ])
    return "random: expect", codes


def b_columns(rng, r):
    column, name, codes = rng.choice([
        ("key_column", junk_name(rng), NO_COLUMN), ("tenant_column", junk_name(rng), NO_COLUMN),
        ("revision_column", junk_name(rng), NO_COLUMN), ("revision_column", "status", INVALID),
        ("revision_column", "id", INVALID), ("tenant_column", "id", INVALID),
        ("key_column", "price", NOT_UNIQUE),
    ])
    r[column] = name
    return "random: column names", codes


def b_chunk(rng, r):
    r["chunk_size"] = rng.choice([0, -1, -(2**31)])
    return "random: chunk size", INVALID


def b_syntax(rng, r):
    text = random_json_text(rng, r["items"])
    r["items"], codes = rng.choice([
        (text[: rng.randint(0, len(text) - 1)], JSON_SYNTAX),
        (text.replace('"revision"', "revision", 1), JSON_SYNTAX),
        (text[:-1] + ",]", JSON_SYNTAX),
        (text.replace("[", "[NaN, ", 1), JSON_SYNTAX),
        (text.replace("{", '{"status": "\\u0000", ', 1), NUL | JSON_SYNTAX),
        (text.replace("{", '{"status": "\\udfff", ', 1), JSON_SYNTAX),
    ])
    r["items"] = Raw(r["items"])
    return "random: JSON syntax", codes


BREAKERS = [b_key, b_missing, b_revision, b_unknown_column, b_tenant, b_guard, b_duplicate,
            b_non_object, b_deep, b_items, b_set_values, b_expect, b_columns, b_chunk, b_syntax]
# the breakers that still apply once items holds no object
NOT_ITEMS = (b_set_values, b_expect, b_columns, b_chunk)


def test_random_malformed_approvals(db, hostile):
    rng = random.Random(SEED)
    conn = db.connect()
    for n in range(RANDOM_CASES):
        request = random_valid_request(rng, hostile, job_id(f"rnd{n}"))
        kinds, allowed = [], set()
        # one breaker always, a second one now and then: either error may come first
        for breaker in rng.sample(BREAKERS, 2 if rng.random() < 0.3 else 1):
            items = request["items"]
            has_objects = isinstance(items, list) and any(isinstance(i, dict) for i in items)
            if not has_objects and breaker not in NOT_ITEMS:
                continue
            kind, codes = breaker(rng, request)
            kinds.append(kind)
            allowed |= codes
        if isinstance(request["items"], list):
            request["items"] = Raw(random_json_text(rng, request["items"]))
        cls = kinds[0] if len(kinds) == 1 else "random: two at once"
        hostile.refuse(conn, " + ".join(kinds) + f" (case {n})", request, allowed, cls=cls)
    assert hostile.snapshot() == hostile.initial


def test_valid_registration_and_drain_still_work(db, hostile):
    """After all of the above: the same connection registers a real approval, the same
    approval in another order is recognised, and draining it changes exactly its rows;
    of everything tried in this module, only the valid registrations are stored."""
    conn = db.connect()
    rows = hostile.run(
        "SELECT id, revision FROM {orders} WHERE tenant = 'A' AND id <= 12 ORDER BY id"
    ).fetchall()
    items = [{"id": r["id"], "revision": r["revision"]} for r in rows]
    job = job_id("valid")
    request = hostile.request(job, items=items, chunk_size=5, expect={"status": "pending"})
    assert conn.execute(*statement(request)).fetchone() == (job, True, 12, 3)
    request["items"] = list(reversed(items))
    assert conn.execute(*statement(request)).fetchone() == (job, False, 12, 3)
    drained = conn.execute("CALL etc_batch.drain_job(%s)", (job,)).fetchone()
    assert (drained[0], drained[-1]) == (3, "done")
    before = {r["id"]: r["revision"] for r in rows}
    for r in hostile.run("SELECT id, revision, status FROM {orders} ORDER BY id").fetchall():
        if r["id"] in before:
            assert (r["revision"], r["status"]) == (before[r["id"]] + 1, "cancelled"), r
        else:
            assert r["status"] == "pending", r
    jobs = hostile.db.admin.execute(
        "SELECT job_id FROM etc_batch.job WHERE job_id LIKE 'hostile%'"
    ).fetchall()
    kept = ("hostile_after_", "hostile_dupfield_", "hostile_valid_")
    assert jobs and all(j["job_id"].startswith(kept) for j in jobs), jobs
    hostile.assert_intact("the valid registration")


# what the drain reads back -----------------------------------------------------------


def test_a_conflict_on_a_row_beyond_double_precision_is_recorded(db):
    """The row a conflict reports holds a number far beyond double precision: it is
    reported with every digit, and the conflict is recorded as any other."""
    c = psycopg.connect(dbname=db.name, autocommit=True)
    c.add_notice_handler(lambda d: None)
    table = f"wide_{secrets.token_hex(3)}"
    c.execute(sql.SQL("CREATE TABLE {} (tenant text, id int, revision int, price numeric, "
                      "PRIMARY KEY (tenant, id))").format(sql.Identifier(table)))
    c.execute(sql.SQL("INSERT INTO {} VALUES ('A', 1, 1, 1), ('A', 2, 1, 1e400)").format(
        sql.Identifier(table)))
    job = f"wide-{secrets.token_hex(3)}"
    c.execute("SELECT etc_batch.register_job(%s, 'A', %s::regclass, "
              "'[{\"id\": 1, \"revision\": 1}, {\"id\": 2, \"revision\": 1, \"price\": 1}]', 5, "
              "'{\"price\": 2}')", (job, table))
    with pytest.raises(psycopg.errors.IntegrityConstraintViolation) as conflict:
        c.execute("CALL etc_batch.drain_job(%s)", (job,))
    assert conflict.value.sqlstate == "23000"
    status, problem = c.execute(
        "SELECT status, problem::text FROM etc_batch.job WHERE job_id = %s", (job,)).fetchone()
    assert status == "conflict" and "1" + "0" * 400 in problem


def test_a_handler_result_nested_too_deeply_is_only_told_from_null(db):
    """A handler's result says only whether it refused the item (NULL) or not: etc_batch
    reads the row's guard value from the row, never from the result, so JSON nested
    deeper than any reader goes is no error, and the audit holds the row's revision."""
    c = psycopg.connect(dbname=db.name, autocommit=True)
    c.add_notice_handler(lambda d: None)
    tag = secrets.token_hex(3)
    table, fn = f"deep_{tag}", f"deep_handler_{tag}"
    c.execute(sql.SQL("CREATE TABLE {} (tenant text, id int, revision int, PRIMARY KEY (tenant, id))")
              .format(sql.Identifier(table)))
    c.execute(sql.SQL("INSERT INTO {} VALUES ('A', 1, 1)").format(sql.Identifier(table)))
    c.execute(sql.SQL("CREATE FUNCTION {}(item jsonb) RETURNS jsonb LANGUAGE sql AS "
                      "$$ SELECT (repeat('[', 200) || '1' || repeat(']', 200))::jsonb $$")
              .format(sql.Identifier(fn)))
    job = f"deep-{tag}"
    c.execute("SELECT etc_batch.register_job(%s, 'A', %s::regclass, '[{\"id\": 1, \"revision\": 1}]', "
              "5, NULL, handler => %s::regprocedure)", (job, table, f"{fn}(jsonb)"))
    assert c.execute("CALL etc_batch.drain_job(%s)", (job,)).fetchone()[4] == "done"
    assert c.execute("SELECT revision_before, revision_after FROM etc_batch.job_audit_items "
                     "WHERE job_id = %s", (job,)).fetchone() == (1, 1)


def test_numbers_on_a_numeric_column_keep_every_digit(db):
    """A guard is compared exactly: 0.1000000000000000001 is not 0.1, and a value far
    beyond double precision is kept and matched as it is."""
    c = psycopg.connect(dbname=db.name, autocommit=True)
    c.add_notice_handler(lambda d: None)
    table = f"exact_{secrets.token_hex(3)}"
    c.execute(sql.SQL("CREATE TABLE {} (tenant text, id int, revision int, price numeric, "
                      "status text DEFAULT 'pending', PRIMARY KEY (tenant, id))").format(sql.Identifier(table)))
    big = "1" + "0" * 400
    c.execute(sql.SQL("INSERT INTO {} (tenant, id, revision, price) VALUES "
                      "('A', 1, 1, 0.1000000000000000001), ('A', 2, 1, 0.1), ('A', 3, 1, %s::numeric)")
              .format(sql.Identifier(table)), (big,))
    job = f"exact-{secrets.token_hex(3)}"
    c.execute("SELECT etc_batch.register_job(%s, 'A', %s::regclass, %s::jsonb, 5, "
              "'{\"status\": \"done\"}')",
              (job, table, '[{"id": 1, "revision": 1, "price": 0.1000000000000000001}, '
                           '{"id": 2, "revision": 1, "price": 0.10}, '
                           f'{{"id": 3, "revision": 1, "price": 1e400}}]'))
    stored = [r[0] for r in c.execute(
        "SELECT guards->>'price' FROM etc_batch.job_item WHERE job_id = %s ORDER BY position", (job,))]
    assert stored == ["0.1000000000000000001", "0.1", big]
    assert c.execute("CALL etc_batch.drain_job(%s)", (job,)).fetchone()[-1] == "done"
    # the same approval spelled otherwise is the same request
    again = c.execute("SELECT created FROM etc_batch.register_job(%s, 'A', %s::regclass, %s::jsonb, 5, "
                      "'{\"status\": \"done\"}')",
                      (job, table, '[{"id": 3, "revision": 1, "price": 10e399}, '
                                   '{"id": 2, "revision": 1, "price": 0.1000}, '
                                   '{"id": 1, "revision": 1, "price": 1.000000000000000001e-1}]')).fetchone()
    assert again == (False,)
    # and a guard that differs only beyond double precision is a conflict
    other = f"exact2-{secrets.token_hex(3)}"
    c.execute(sql.SQL("UPDATE {} SET status = 'pending'").format(sql.Identifier(table)))
    c.execute("SELECT etc_batch.register_job(%s, 'A', %s::regclass, %s::jsonb, 5, "
              "'{\"status\": \"done\"}')",
              (other, table, '[{"id": 1, "revision": 2, "price": 0.1000000000000000002}]'))
    with pytest.raises(psycopg.errors.IntegrityConstraintViolation) as conflict:
        c.execute("CALL etc_batch.drain_job(%s)", (other,))
    assert "0.1000000000000000001" in str(conflict.value.diag.message_detail) + c.execute(
        "SELECT problem::text FROM etc_batch.job WHERE job_id = %s", (other,)).fetchone()[0]


def test_numbers_beyond_a_columns_range_precision_or_scale_are_refused_at_registration(db):
    """Kept whole, a number can still be too large for its column: float8 stops near
    1.8e308, and numeric(6,2) at 9999.99. PostgreSQL judges it when the job is
    registered, not at every chunk."""
    c = psycopg.connect(dbname=db.name, autocommit=True)
    c.add_notice_handler(lambda d: None)
    table = f"ranged_{secrets.token_hex(3)}"
    c.execute(sql.SQL("CREATE TABLE {} (tenant text, id int, revision int, r float8, "
                      "p numeric(6,2), PRIMARY KEY (tenant, id))").format(sql.Identifier(table)))
    c.execute(sql.SQL("INSERT INTO {} VALUES ('A', 1, 1, 1, 1)").format(sql.Identifier(table)))
    for field in ('"r": 1e400', '"p": 123456.5', '"r": -1e309'):
        job = f"ranged-{secrets.token_hex(3)}"
        with pytest.raises(psycopg.Error) as refused:
            c.execute("SELECT etc_batch.register_job(%s, 'A', %s::regclass, %s::jsonb, 5, "
                      "'{\"p\": 2}')", (job, table, f'[{{"id": 1, "revision": 1, {field}}}]'))
        assert refused.value.sqlstate in ("22003", "22023"), (field, refused.value.sqlstate)
        assert c.execute("SELECT count(*) FROM etc_batch.job WHERE job_id = %s",
                         (job,)).fetchone() == (0,)


# -- register_job_from_query ------------------------------------------------------------

QUERY_SYNTAX = {"42601"}
FROM_QUERY = {"22023"}
CASES_QUERY = [
    # not a SELECT
    ("statement: INSERT", "INSERT INTO {orders} (tenant, id, revision, qty) VALUES ('A', 999, 1, 1) "
                          "RETURNING id, revision", FROM_QUERY),
    ("statement: UPDATE", "UPDATE {orders} SET qty = 0 RETURNING id, revision", FROM_QUERY),
    ("statement: DELETE", "DELETE FROM {orders} RETURNING id, revision", FROM_QUERY),
    ("statement: MERGE", "MERGE INTO {orders} o USING (SELECT 1 AS id) s ON o.id = s.id "
                         "WHEN MATCHED THEN DELETE", FROM_QUERY),
    ("statement: TRUNCATE", "TRUNCATE {orders}", FROM_QUERY),
    ("statement: COPY", "COPY {orders} TO STDOUT", FROM_QUERY),
    ("statement: DO", "DO $x$ BEGIN DELETE FROM {orders}; END $x$", FROM_QUERY),
    ("statement: CALL", "CALL etc_batch.drain_job('x')", FROM_QUERY),
    ("statement: EXPLAIN ANALYZE", "EXPLAIN ANALYZE DELETE FROM {orders}", FROM_QUERY),
    ("statement: CREATE TABLE AS", "CREATE TABLE stolen AS SELECT id, revision FROM {orders}", FROM_QUERY),
    ("statement: SELECT INTO", "SELECT id, revision INTO stolen FROM {orders}", FROM_QUERY),
    ("statement: DECLARE", "DECLARE c CURSOR FOR SELECT id, revision FROM {orders}", FROM_QUERY),
    ("statement: PREPARE", "PREPARE p AS SELECT id, revision FROM {orders}", FROM_QUERY),
    ("statement: SET ROLE", "SET ROLE postgres", FROM_QUERY),
    ("statement: transaction control", "COMMIT", FROM_QUERY),
    ("statement: LISTEN", "LISTEN hostile", FROM_QUERY),
    ("statement: VACUUM", "VACUUM {orders}", FROM_QUERY),
    # a SELECT that writes through its WITH
    ("with: DELETE", "WITH d AS (DELETE FROM {orders} RETURNING id, revision) SELECT * FROM d", FROM_QUERY),
    ("with: UPDATE", "WITH u AS (UPDATE {orders} SET qty = 0 RETURNING id, revision) SELECT * FROM u",
     FROM_QUERY),
    ("with: INSERT, nested", "WITH a AS (SELECT id, revision FROM {orders}), "
                             "b AS (INSERT INTO {orders} (tenant, id, revision) VALUES ('A', 998, 1) "
                             "RETURNING id, revision) SELECT * FROM a", FROM_QUERY),
    # more than one statement, or none
    ("statements: two", "SELECT id, revision FROM {orders}; DELETE FROM {orders}", FROM_QUERY),
    ("statements: injection after a quote",
     "SELECT id, revision FROM {orders} WHERE tenant = 'A'; DROP TABLE {orders}; --", FROM_QUERY),
    ("statements: only semicolons", ";;", FROM_QUERY),
    ("statements: only a comment", "-- nothing", FROM_QUERY),
    ("statements: empty", "", FROM_QUERY),
    ("syntax: truncated", "SELECT id, revision FROM", QUERY_SYNTAX),
    ("syntax: unterminated quote", "SELECT id, revision FROM {orders} WHERE tenant = 'A", QUERY_SYNTAX),
    ("syntax: unterminated dollar quote", "SELECT $q$ AS id", QUERY_SYNTAX),
    ("syntax: misspelt", "SELCT id, revision FROM {orders}", QUERY_SYNTAX),
    # what it returns
    ("columns: TABLE", "TABLE {orders}", FROM_QUERY),
    ("columns: VALUES", "VALUES (1, 1)", NO_COLUMN),
    ("columns: no revision", "SELECT id FROM {orders}", FROM_QUERY),
    ("columns: no key", "SELECT revision FROM {orders}", FROM_QUERY),
    ("columns: one twice", "SELECT id, revision, qty, qty FROM {orders}", FROM_QUERY),
    ("columns: the tenant", "SELECT id, revision, tenant FROM {orders}", FROM_QUERY),
    ("columns: unknown", "SELECT id, revision, 1 AS colour FROM {orders}", NO_COLUMN),
    ("columns: empty name", 'SELECT id, revision, 1 AS "" FROM {orders}', {"42601", "42703"}),
    ("type: text key", "SELECT id::text AS id, revision FROM {orders}", {"42804"}),
    ("type: text revision", "SELECT id, revision::text AS revision FROM {orders}", {"42804"}),
    ("type: text guard", "SELECT id, revision, qty::text AS qty FROM {orders}", {"42804"}),
    ("type: jsonb guard on a date", "SELECT id, revision, '{}'::jsonb AS due FROM {orders}", {"42804"}),
    ("value: key NULL", "SELECT NULL::int AS id, revision FROM {orders}", FROM_QUERY),
    ("value: revision NULL", "SELECT id, NULL::int AS revision FROM {orders}", FROM_QUERY),
    ("value: key twice", "SELECT id % 3 AS id, revision FROM {orders}", FROM_QUERY),
    ("value: revision beyond the column", "SELECT id, 2147483648::bigint AS revision FROM {orders}",
     {"22003"}),
    # errors of the query itself, at registration
    ("runtime: division by zero", "SELECT id, revision FROM {orders} WHERE 1 / 0 = 1", {"22012"}),
    ("runtime: unknown table", "SELECT id, revision FROM no_such_table_hostile", {"42P01"}),
    ("runtime: unknown function", "SELECT id, revision FROM {orders} WHERE no_such_fn(id)", {"42883"}),
    ("runtime: bad cast", "SELECT 'x'::int AS id, 1 AS revision", {"22P02"}),
]


def from_query(job, query, target):
    return (
        "SELECT * FROM etc_batch.register_job_from_query(job_id => %s, tenant => 'A', "
        "target => %s::regclass, items_query => %s, chunk_size => 10, "
        "set_values => '{\"status\": \"cancelled\"}')",
        (job, target, query),
    )


@pytest.mark.parametrize("kind, query, allowed", CASES_QUERY, ids=[c[0] for c in CASES_QUERY])
def test_hostile_items_query_is_refused_cleanly(db, hostile, kind, query, allowed):
    conn = db.connect()
    pid = conn.info.backend_pid
    what = f"items_query {kind}"
    job = job_id("query")
    text = query.replace("{orders}", sql.Identifier(hostile.orders).as_string(db.admin))
    statement_text, params = from_query(job, text, hostile.orders)
    before = hostile.snapshot()
    with pytest.raises(psycopg.Error) as refused:
        conn.execute(statement_text, params)
    code = refused.value.sqlstate
    SEEN["items_query " + kind.split(":")[0]][code] += 1
    shown = f"{what}: SQLSTATE {code}: {str(refused.value)[:400]}"
    assert code is not None, f"no SQLSTATE, the connection was lost: {shown}"
    assert not code.startswith("XX"), f"internal error: {shown}"
    assert code in allowed, f"expected one of {sorted(allowed)}: {shown}"
    assert conn.execute("SELECT pg_backend_pid()").fetchone()[0] == pid, shown
    hostile.assert_intact(what)
    assert hostile.stored(job) == (0, 0), f"{what}: something was stored"
    # nothing the query tried was done, and no table was left behind
    assert hostile.snapshot() == before, f"{what}: the business table changed"
    assert db.admin.execute("SELECT to_regclass('stolen') IS NULL AS gone").fetchone()["gone"]
    hostile.refused += 1
    # the connection that saw the error registers a valid query right after it
    good = job_id("after_query")
    row = conn.execute(*from_query(
        good, sql.SQL("SELECT id, revision, qty FROM {} WHERE tenant = 'A' AND id <= 3")
        .format(sql.Identifier(hostile.orders)).as_string(db.admin), hostile.orders)).fetchone()
    assert row == (good, True, 3, 1)
