"""README.md and docs/*.md cannot drift from the extension.

- Every block fenced as ```sql signature``` declares routines, tables and views, one
  per entry, and each must be exactly what the installed extension has: a routine's
  arguments (names, types, modes, defaults, in order) and its result, a table's or
  view's columns and their types, in order. Every routine, table and view of etc_batch
  must be declared so somewhere.
- Every block that shows output (psql's rows, NOTICE, ERROR) is preceded by a line
  `<!-- output: <file> -->` naming the expected file of a test (pg_regress, the
  isolation tester) that produces it, and its lines stand in that file, in order, one
  after another. Those tests compare their output with the file, so what the
  documentation shows is what the extension printed.
- Every block of code preceded by a line `<!-- code: <file> -->` is quoted from that
  file, a test that runs it: its lines stand there, in order, one after another (blank
  lines and indentation aside).
"""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]

FENCE = re.compile(r"^```(.*)$")
SOURCE = re.compile(r"^<!-- output: (\S+) -->$")
# What only output looks like: psql's header rule, its row count, a server message.
OUTPUT = re.compile(r"^(-+\+[-+]*|\(\d+ rows?\)|(NOTICE|ERROR|WARNING|DETAIL|HINT|INFO):  )")


def blocks(page):
    """(info string, source marker or None, first line number, lines) of each fenced block."""
    lines = page.read_text().splitlines()
    out, i = [], 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        info, start = m.group(1).strip(), i + 1
        j = start
        while j < len(lines) and lines[j] != "```":
            j += 1
        source = None
        k = i - 1
        while k >= 0 and lines[k].strip() == "":
            k -= 1
        if k >= 0 and SOURCE.match(lines[k]):
            source = SOURCE.match(lines[k]).group(1)
        out.append((info, source, start + 1, lines[start:j]))
        i = j + 1
    return out


def all_blocks():
    for page in PAGES:
        for info, source, line, body in blocks(page):
            yield page.relative_to(ROOT), info, source, line, body


# -- examples ----------------------------------------------------------------------------


def shown_output():
    return [b for b in all_blocks() if b[2] or any(OUTPUT.match(l) for l in b[4])]


@pytest.mark.parametrize("page, info, source, line, body", shown_output(),
                         ids=[f"{b[0]}:{b[3]}" for b in shown_output()])
def test_every_output_shown_was_printed_by_a_test(page, info, source, line, body):
    where = f"{page}:{line}"
    assert source, f"{where}: a block that shows output needs <!-- output: <expected file> --> above it"
    expected = ROOT / source
    assert expected.is_file(), f"{where}: {source} does not exist"
    assert "expected" in expected.parts, f"{where}: {source} is not a test's expected output"
    have = [l.rstrip() for l in expected.read_text().splitlines()]
    want = [l.rstrip() for l in body]
    assert want, f"{where}: empty example"
    starts = [i for i in range(len(have) - len(want) + 1) if have[i:i + len(want)] == want]
    assert starts, (
        f"{where}: these lines do not stand, one after another, in {source}:\n"
        + "\n".join(want)
    )


def setup_of(expected):
    """The test file that makes what an expected output shows: a pg_regress file, an
    isolation spec, or the pytest file that compares its output with it."""
    path = Path(expected)
    if path.parts[:2] == ("tests", "pg_regress"):
        return f"tests/pg_regress/sql/{path.stem}.sql"
    if path.parts[:2] == ("tests", "isolation"):
        return f"tests/isolation/specs/{path.stem}.spec"
    suite = ROOT / path.parts[0] / path.parts[1]
    named = sorted(f for f in suite.glob("test_*.py") if path.name in f.read_text())
    assert len(named) == 1, f"{expected}: compared by {named}"
    return str(named[0].relative_to(ROOT))


@pytest.mark.parametrize("page, info, source, line, body", shown_output(),
                         ids=[f"{b[0]}:{b[3]}" for b in shown_output()])
def test_every_output_shown_names_the_file_with_its_setup(page, info, source, line, body):
    """An example is self-contained: the tables and rows it works on are in the test file
    that ran it, which the page names next to it (just above or just below)."""
    if not source:
        return
    lines = (ROOT / page).read_text().splitlines()
    start, end = line - 1, line - 1 + len(body)
    near = "\n".join(lines[max(0, start - 14):start] + lines[end:end + 4])
    assert setup_of(source) in near, f"{page}:{line}: name {setup_of(source)} next to the example"


CODE = re.compile(r"^<!-- code: (\S+) -->$")


def quoted_code():
    """(page, line, file, lines) of each block marked as quoted from a test's source."""
    out = []
    for page in PAGES:
        lines = page.read_text().splitlines()
        for i, line in enumerate(lines):
            m = CODE.match(line)
            if not m:
                continue
            j = i + 1
            while j < len(lines) and not FENCE.match(lines[j]):
                j += 1
            k = j + 1
            while k < len(lines) and lines[k] != "```":
                k += 1
            out.append((page.relative_to(ROOT), j + 2, m.group(1), lines[j + 1:k]))
    return out


@pytest.mark.parametrize("page, line, source, body", quoted_code(),
                         ids=[f"{q[0]}:{q[1]}" for q in quoted_code()])
def test_every_code_quoted_is_in_the_test_that_runs_it(page, line, source, body):
    where = f"{page}:{line}"
    path = ROOT / source
    assert path.is_file(), f"{where}: {source} does not exist"
    have = [l.strip() for l in path.read_text().splitlines() if l.strip()]
    want = [l.strip() for l in body if l.strip()]
    assert want, f"{where}: empty block"
    assert any(have[i:i + len(want)] == want for i in range(len(have) - len(want) + 1)), (
        f"{where}: these lines do not stand, one after another, in {source}:\n" + "\n".join(want))


# What only etc_batch.progress_interval = 0 prints: a NOTICE per chunk or step.
PER_CHUNK = re.compile(r'^NOTICE:  (chunk \d+ of \d+ committed|step \d+ of batch ".*" '
                       r'(committed|is already done, skipping))')


@pytest.mark.parametrize("page, info, source, line, body", shown_output(),
                         ids=[f"{b[0]}:{b[3]}" for b in shown_output()])
def test_every_output_shown_was_printed_at_the_default_settings(page, info, source, line, body):
    """What a DBA pastes prints what the page shows: a block with a NOTICE per chunk or
    step must show the SET that asks for them."""
    if any(PER_CHUNK.match(l) for l in body):
        assert any("progress_interval" in l for l in body), (
            f"{page}:{line}: printed at etc_batch.progress_interval = 0, not the default")


NOT_RUN = re.compile(r"^<!-- not run: .{10,} -->$")


def sql_blocks():
    """(page, line, the line above) of every ```sql block that is no signature."""
    out = []
    for page in PAGES:
        lines = page.read_text().splitlines()
        for i, line in enumerate(lines):
            if line.strip() == "```sql":
                k = i - 1
                while k >= 0 and not lines[k].strip():
                    k -= 1
                out.append((page.relative_to(ROOT), i + 1, lines[k] if k >= 0 else ""))
    return out


@pytest.mark.parametrize("page, line, above", sql_blocks(), ids=[f"{b[0]}:{b[1]}" for b in sql_blocks()])
def test_every_sql_example_is_run_by_a_test_or_says_why_not(page, line, above):
    """A DBA pastes what a page shows: every block of SQL is quoted from a test that runs
    it (`<!-- code: ... -->`), or says why no test runs it as written."""
    assert CODE.match(above) or NOT_RUN.match(above), (
        f"{page}:{line}: a ```sql block needs <!-- code: <test file> --> or <!-- not run: why --> above it")


def test_there_are_examples_to_check():
    # a documentation whose examples all lost their markers would pass the test above
    assert len(shown_output()) >= 15


# -- signatures --------------------------------------------------------------------------

HEAD = re.compile(r"^(?:(?P<call>CALL)\s+)?(?:(?P<kind>TABLE|VIEW)\s+)?etc_batch\.(?P<name>\w+)\s*\(")


def parse_entry(text):
    """{call, kind, name, args, result} of one declaration, or None: the argument list
    is the balanced parenthesis after the name, the result what follows RETURNS."""
    m = HEAD.match(text)
    if not m:
        return None
    depth, quoted, end = 1, False, None
    for i in range(m.end(), len(text)):
        ch = text[i]
        if ch == "'":
            quoted = not quoted
        elif not quoted and ch == "(":
            depth += 1
        elif not quoted and ch == ")":
            depth -= 1
            if depth == 0:
                end = i
                break
    if end is None:
        return None
    rest = text[end + 1:].strip()
    result = None
    if rest:
        r = re.match(r"^RETURNS\s+(.+)$", rest, re.S)
        if not r:
            return None
        result = r.group(1)
    return {"call": bool(m.group("call")), "kind": m.group("kind") or "", "name": m.group("name"),
            "args": text[m.end():end], "result": result}


def declarations():
    """(page, line, text) of every entry of every ```sql signature``` block; an entry
    starts at a line that is not indented and runs to the next."""
    out = []
    for page, info, _source, line, body in all_blocks():
        if info != "sql signature":
            continue
        entry, at = [], line
        for n, text in enumerate(body):
            if text and not text[0].isspace() and entry:
                out.append((page, at, " ".join(entry)))
                entry = []
            if not entry:
                at = line + n
            if text.strip():
                entry.append(text.strip())
        if entry:
            out.append((page, at, " ".join(entry)))
    return out


def split_top(text):
    """Splits on commas outside parentheses and quotes."""
    parts, depth, quoted, cur = [], 0, False, ""
    for ch in text:
        if ch == "'":
            quoted = not quoted
        elif not quoted and ch == "(":
            depth += 1
        elif not quoted and ch == ")":
            depth -= 1
        if ch == "," and depth == 0 and not quoted:
            parts.append(cur.strip())
            cur = ""
        else:
            cur += ch
    if cur.strip():
        parts.append(cur.strip())
    return parts


def norm_type(conn, type_text):
    return conn.execute("SELECT pg_catalog.format_type(%s::regtype, NULL)", (type_text,)).fetchone()[0]


def norm_default(default):
    """A catalog default without the cast PostgreSQL prints: NULL::integer -> NULL."""
    return re.sub(r"::[\w. \[\]\"]+$", "", default.strip())


def parse_argument(conn, text):
    m = re.match(r'^(?:(INOUT|OUT|IN)\s+)?("?\w+"?)\s+(.+?)(?:\s+DEFAULT\s+(.+))?$', text)
    assert m, f"cannot read the argument {text!r}"
    mode, name, type_text, default = m.groups()
    return (mode or "IN", name.strip('"'), norm_type(conn, type_text),
            None if default is None else norm_default(default))


def parse_result(conn, text):
    text = text.strip()
    m = re.match(r"^TABLE\s*\((.*)\)$", text, re.S)
    if m:
        return ("TABLE", [(c.split()[0].strip('"'), norm_type(conn, " ".join(c.split()[1:])))
                          for c in split_top(m.group(1))])
    return ("TYPE", norm_type(conn, text))


def catalog_routine(conn, name):
    rows = conn.execute(
        "SELECT p.prokind, pg_catalog.pg_get_function_arguments(p.oid),"
        "       pg_catalog.pg_get_function_result(p.oid)"
        "  FROM pg_catalog.pg_proc p"
        " WHERE p.pronamespace = 'etc_batch'::regnamespace AND p.proname = %s",
        (name,),
    ).fetchall()
    assert len(rows) == 1, f"etc_batch.{name}: {len(rows)} routines in the catalog"
    return rows[0]


def catalog_columns(conn, name, kind):
    return conn.execute(
        "SELECT a.attname, pg_catalog.format_type(a.atttypid, NULL)"
        "  FROM pg_catalog.pg_attribute a JOIN pg_catalog.pg_class c ON c.oid = a.attrelid"
        " WHERE c.relnamespace = 'etc_batch'::regnamespace AND c.relname = %s"
        "   AND c.relkind = ANY (%s) AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum",
        (name, ["r", "p"] if kind == "TABLE" else ["v"]),
    ).fetchall()


@pytest.mark.parametrize("page, line, text", declarations(),
                         ids=[f"{p}:{l}" for p, l, _t in declarations()])
def test_every_documented_signature_is_the_installed_one(catalog, page, line, text):
    where = f"{page}:{line}"
    m = parse_entry(text)
    assert m, f"{where}: not a declaration: {text}"
    name, kind = m["name"], m["kind"]
    if kind:
        documented = [tuple(c.split(maxsplit=1)) for c in split_top(m["args"])]
        documented = [(c, norm_type(catalog, t)) for c, t in documented]
        assert documented == catalog_columns(catalog, name, kind), where
        return
    prokind, arguments, result = catalog_routine(catalog, name)
    documented = [parse_argument(catalog, a) for a in split_top(m["args"])]
    installed = [parse_argument(catalog, a) for a in split_top(arguments)]
    assert documented == installed, f"{where}: etc_batch.{name}({arguments})"
    if prokind == "p":
        assert m["call"], f"{where}: etc_batch.{name} is a procedure: write CALL"
        assert m["result"] is None, where
    else:
        assert not m["call"], f"{where}: etc_batch.{name} is a function"
        assert m["result"], f"{where}: etc_batch.{name} needs its RETURNS"
        documented_result = parse_result(catalog, m["result"])
        assert documented_result == parse_result(catalog, result), f"{where}: RETURNS {result}"


def test_everything_of_etc_batch_is_documented(catalog):
    documented = {(m["kind"], m["name"]) for _p, _l, text in declarations()
                  if (m := parse_entry(text))}
    # what the extension itself made: a job's own partitions are tables of their own
    members = (
        "SELECT d.objid FROM pg_catalog.pg_depend d"
        " WHERE d.refclassid = 'pg_catalog.pg_extension'::regclass AND d.deptype = 'e'"
        "   AND d.refobjid = (SELECT e.oid FROM pg_catalog.pg_extension e"
        "                      WHERE e.extname = 'etc_batch')"
    )
    routines = catalog.execute(
        "SELECT p.proname FROM pg_catalog.pg_proc p"
        " WHERE p.pronamespace = 'etc_batch'::regnamespace"
        "   AND p.prorettype <> 'pg_catalog.trigger'::regtype"
        f"   AND p.oid IN ({members})"
    ).fetchall()
    relations = catalog.execute(
        "SELECT CASE WHEN c.relkind IN ('r', 'p') THEN 'TABLE' ELSE 'VIEW' END, c.relname"
        "  FROM pg_catalog.pg_class c"
        " WHERE c.relnamespace = 'etc_batch'::regnamespace AND c.relkind IN ('r', 'p', 'v')"
        f"   AND c.oid IN ({members})"
    ).fetchall()
    missing = sorted(({("", r[0]) for r in routines} | set(relations)) - documented)
    assert not missing, f"not declared in any ```sql signature``` block: {missing}"


# -- the benchmark ---------------------------------------------------------------------

QUOTED = re.compile(r"^<!-- quoted whole: (\S+) -->$", re.M)


def test_the_benchmark_page_quotes_the_latest_results_whole():
    """docs/benchmark.md shows bench/results/latest.md, and every other result it quotes
    whole, as bench/run wrote it, every line."""
    page = (ROOT / "docs" / "benchmark.md").read_text()
    quoted_files = QUOTED.findall(page)
    assert "bench/results/latest.md" in quoted_files
    for name in quoted_files:
        start, end = f"<!-- quoted whole: {name} -->", f"<!-- end of {name} -->"
        assert page.count(start) == 1 and page.count(end) == 1, name
        quoted = page.split(start, 1)[1].split(end, 1)[0]
        assert quoted.strip() == (ROOT / name).read_text().strip(), name
