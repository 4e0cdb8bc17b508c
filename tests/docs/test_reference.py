"""docs/reference.md against the installed extension: one entry (a `### name` heading) for
every routine, table, view and setting; each routine's parameter list is its arguments,
in order, with their types and defaults; each view's column list is its columns; each
setting says its type, unit, default and context as pg_settings does; each routine
names the SQLSTATEs it raises, every one of them in the table of errors of
docs/operations.md; and each routine, view and setting has an example whose output a
test printed (test_docs.py checks that the output stands in that test's file).

The signatures themselves are checked by test_docs.py, which also requires that every
object is declared somewhere; this requires that the declaration is the reference's.
"""

import re
from pathlib import Path

import pytest

from test_docs import declarations, norm_default, norm_type, parse_entry, split_top

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "reference.md"
ERRORS = ROOT / "docs" / "operations.md"

ENTRY = re.compile(r"^### (\S+)$", re.M)
ITEM = re.compile(r"^- `(?P<name>\w+)` (?P<type>[^,:]+?)(?:, default (?P<default>.+?))?: \S")
COLUMN = re.compile(r"^- `(?P<name>\w+)`: \S")
SQLSTATE = re.compile(r"\b([0-9A-Z]{5})\b")


def entries():
    """{name: text of its entry} in the page's order."""
    text = PAGE.read_text()
    found = {}
    heads = list(ENTRY.finditer(text))
    for i, m in enumerate(heads):
        end = heads[i + 1].start() if i + 1 < len(heads) else len(text)
        body = text[m.end():end].split("\n## ", 1)[0]
        assert m.group(1) not in found, f"two entries for {m.group(1)}"
        found[m.group(1)] = body
    return found


def listed(body, header, pattern):
    """The items of the list under the line `header`."""
    lines = body.splitlines()
    if header not in lines:
        return None
    items = []
    for line in lines[lines.index(header) + 1:]:
        if not line.startswith("- "):
            if line.startswith("  ") and items:
                continue
            break
        m = pattern.match(line)
        assert m, f"cannot read the line {line!r}"
        items.append(m.groupdict())
    return items


def has_example(body):
    return bool(re.search(r"^<!-- (output|code): \S+ -->$", body, re.M))


def known_sqlstates():
    table = ERRORS.read_text().split("## Errors", 1)[1]
    return set(SQLSTATE.findall(table))


def installed(catalog):
    """(kind, name) of every routine, table and view of the extension, and every setting."""
    members = (
        "SELECT d.objid FROM pg_catalog.pg_depend d"
        " WHERE d.refclassid = 'pg_catalog.pg_extension'::regclass AND d.deptype = 'e'"
        "   AND d.refobjid = (SELECT oid FROM pg_catalog.pg_extension WHERE extname = 'etc_batch')")
    routines = catalog.execute(
        "SELECT CASE p.prokind WHEN 'p' THEN 'procedure' ELSE 'function' END, p.proname"
        "  FROM pg_catalog.pg_proc p WHERE p.pronamespace = 'etc_batch'::regnamespace"
        "   AND p.prorettype <> 'pg_catalog.trigger'::regtype"
        f"  AND p.oid IN ({members})").fetchall()
    relations = catalog.execute(
        "SELECT CASE WHEN c.relkind = 'v' THEN 'view' ELSE 'table' END, c.relname"
        "  FROM pg_catalog.pg_class c WHERE c.relnamespace = 'etc_batch'::regnamespace"
        f"   AND c.relkind IN ('r', 'p', 'v') AND c.oid IN ({members})").fetchall()
    settings = catalog.execute(
        "SELECT 'setting', name FROM pg_catalog.pg_settings WHERE name LIKE 'etc_batch.%'"
        # a test build's own aid, not in the release a DBA installs
        "   AND name <> 'etc_batch.crash_at'").fetchall()
    return routines + relations + settings


def test_every_object_and_setting_has_one_entry(catalog):
    have = entries()
    missing = sorted(name for _kind, name in installed(catalog) if name not in have)
    assert missing == []
    unknown = sorted(set(have) - {name for _kind, name in installed(catalog)})
    assert unknown == [], "entries for what the extension does not have"


def test_every_signature_is_declared_in_the_reference_only():
    """One place for each: the guides link to the reference for a signature, and each
    entry declares its own object, once."""
    elsewhere = sorted({f"{page}:{line}" for page, line, _text in declarations()
                        if page != PAGE.relative_to(ROOT)})
    assert elsewhere == []
    for name, body in entries().items():
        blocks = re.findall(r"^```sql signature\n(.*?)^```$", body, re.M | re.S)
        if name.startswith("etc_batch."):
            assert blocks == [], name
            continue
        assert len(blocks) == 1, f"{name}: {len(blocks)} signature blocks"
        declared = parse_entry(" ".join(l.strip() for l in blocks[0].splitlines()))
        assert declared and declared["name"] == name, name


@pytest.mark.parametrize("kind", ["function", "procedure"])
def test_every_routine_lists_its_parameters_and_sqlstates(catalog, kind):
    have = entries()
    known = known_sqlstates()
    for k, name in installed(catalog):
        if k != kind:
            continue
        body = have[name]
        arguments = catalog.execute(
            "SELECT pg_catalog.pg_get_function_arguments(p.oid) FROM pg_catalog.pg_proc p"
            " WHERE p.pronamespace = 'etc_batch'::regnamespace AND p.proname = %s",
            (name,)).fetchone()[0]
        wanted = []
        for arg in split_top(arguments):
            m = re.match(r'^(?:(INOUT|IN)\s+)?("?\w+"?)\s+(.+?)(?:\s+DEFAULT\s+(.+))?$', arg)
            _mode, arg_name, type_text, default = m.groups()
            wanted.append((arg_name.strip('"'), norm_type(catalog, type_text),
                           None if default is None else norm_default(default)))
        items = listed(body, "Parameters:", ITEM)
        if not wanted:
            assert items is None, f"{name} takes no parameters"
        else:
            assert items is not None, f"{name}: no Parameters: list"
            documented = [(i["name"], norm_type(catalog, i["type"].strip()),
                           None if i["default"] is None else norm_default(i["default"].strip("`")))
                          for i in items]
            assert documented == wanted, name
        said = [l for l in body.splitlines() if l.startswith("SQLSTATEs: ")]
        assert len(said) == 1, f"{name}: one line 'SQLSTATEs: ...'"
        codes = SQLSTATE.findall(said[0])
        assert codes or said[0].startswith("SQLSTATEs: none"), f"{name}: {said[0]}"
        assert set(codes) <= known, f"{name}: {sorted(set(codes) - known)} not in operations.md"
        if name not in ("create_job_tables", "attach_job_tables"):  # called by etc_batch only
            assert has_example(body), f"{name}: no example"


def test_every_view_lists_its_columns(catalog):
    have = entries()
    for kind, name in installed(catalog):
        if kind != "view":
            continue
        columns = [r[0] for r in catalog.execute(
            "SELECT a.attname FROM pg_catalog.pg_attribute a"
            " WHERE a.attrelid = ('etc_batch.' || %s)::regclass AND a.attnum > 0"
            "   AND NOT a.attisdropped ORDER BY a.attnum", (name,)).fetchall()]
        items = listed(have[name], "Columns:", COLUMN)
        assert items is not None, f"{name}: no Columns: list"
        assert [i["name"] for i in items] == columns, name
        assert has_example(have[name]), f"{name}: no example"


def test_every_setting_says_what_pg_settings_says(catalog):
    have = entries()
    rows = catalog.execute(
        "SELECT name, vartype, unit, boot_val, context, enumvals FROM pg_catalog.pg_settings"
        " WHERE name LIKE 'etc_batch.%' AND name <> 'etc_batch.crash_at'").fetchall()
    settings_section = PAGE.read_text().split("\n## Settings", 1)[1]
    assert has_example(settings_section.split("\n### ", 1)[0]), "the settings need an example"
    for name, vartype, unit, boot_val, context, enumvals in rows:
        first = have[name].strip().split(". ", 1)[0].replace("\n", " ")
        if vartype == "enum":
            kind = "enum (" + ", ".join(f"`{v}`" for v in enumvals) + ")"
        else:
            kind = vartype + {"ms": ", milliseconds", "s": ", seconds", None: ""}[unit]
        assert first == f"{kind}, default `{boot_val}`, context `{context}`", name


def test_the_routines_public_keeps_are_the_ones_named(catalog):
    text = PAGE.read_text().split("\n## ", 1)[0]
    sentence = re.search(r"PUBLIC\s+keeps (.*?)\.\n", text, re.S)
    assert sentence, "the introduction names what PUBLIC keeps"
    named = set(re.findall(r"`(\w+)`", sentence.group(1)))
    public = {r[0] for r in catalog.execute(
        "SELECT p.proname FROM pg_catalog.pg_proc p WHERE p.pronamespace = 'etc_batch'::regnamespace"
        "   AND pg_catalog.has_function_privilege('public', p.oid, 'EXECUTE')"
        "   AND p.prorettype <> 'pg_catalog.trigger'::regtype").fetchall()}
    assert named == public
