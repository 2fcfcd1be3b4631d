"""``inspector corpus --sql`` reads the scan and nothing else (issue 40): DuckDB opens with the extensions' automatic
install and load off, the file system and URLs closed but for the scan's own parts, and its configuration locked,
so that no statement turns a setting back; ``--allow-external`` opens it. ``--top N`` fetches the rows it prints
(plus one), so a huge result costs what is shown.

The scan folder is made once per module (ten lease clauses, the tiny seeded BERT); HOME points at a fresh folder in
each test, where DuckDB would put ``~/.duckdb/extensions``.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from inspector import cli
from inspector.capture.models import LoadedModel
from inspector.corpus import queries as corpus
from inspector.corpus.documents import Fields
from inspector.corpus.engine import Engine
from inspector.corpus.leases import lease_rows, write_jsonl
from inspector.corpus.scan import scan
from inspector.errors import InspectorError

import tiny

ROOT = Path(__file__).resolve().parent.parent
PEAK_RSS = 1 << 30  # a --top 3 of 10^8 rows: the interpreter, torch, pandas and DuckDB (about 600 MiB), far below the
# result (two int64 columns of 10^8 rows: 1.6 GB; the whole fetch peaked at 3.5 GB)


@pytest.fixture(scope="module")
def scanned(tmp_path_factory):
    root = tmp_path_factory.mktemp("lockdown")
    data = write_jsonl(root / "leases.jsonl", lease_rows(10))
    out = root / "scan [1] it's"  # glob characters and a quote: the allowed paths are the views' own
    scan(data, out, fields=Fields(query="query", referents="referents", id="id"), engine=Engine(batch_size=4),
         loaded=LoadedModel(tiny.build("bert"), tiny.tokenizer(), "tiny-bert"), progress=False)
    outside = root / "outside.csv"
    outside.write_text("a,b\n1,2\n")
    return out, outside


@pytest.fixture
def home(tmp_path, monkeypatch):
    path = tmp_path / "home"
    path.mkdir()
    monkeypatch.setenv("HOME", str(path))
    return path


def one_line(capsys, argv) -> str:
    code = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    lines = [line for line in err.strip().splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and lines[0].startswith("inspector: error:"), (argv, code, out, err)
    return lines[0]


def lit(path) -> str:
    """A SQL string literal of ``path``."""
    return "'" + str(path).replace("'", "''") + "'"


def _cases(out: Path, outside: Path, tmp: Path) -> list[tuple[str, str]]:
    """(statement, what its one line says): every way out of the scan that a --sql statement could take."""
    return [
        ("SELECT * FROM read_json('https://example.com/x.json')", "reads only the scan's own files"),
        ("SELECT * FROM 'https://example.com/heads.parquet'", "reads only the scan's own files"),
        (f"SELECT * FROM read_csv({lit(outside)})", "--allow-external"),
        ("SELECT * FROM read_csv('/etc/passwd')", "reads only the scan's own files"),
        (f"SELECT * FROM read_parquet({lit(out / '..' / 'outside.csv')})", "reads only the scan's own files"),
        (f"SELECT * FROM glob({lit(tmp / '*')})", "reads only the scan's own files"),
        (f"CREATE VIEW v AS SELECT * FROM read_csv({lit(outside)}); SELECT * FROM v", "at statement 1 of 2"),
        ("INSTALL httpfs", "INSTALL or LOAD statement is refused"),  # DuckDB names its type LOAD
        ("FORCE INSTALL httpfs FROM core", "statement is refused"),
        ("LOAD httpfs", "INSTALL or LOAD statement is refused"),
        (f"ATTACH {lit(tmp / 'x.db')}", "ATTACH statement is refused"),
        (f"COPY (SELECT 1) TO {lit(out / 'x.csv')}", "COPY statement is refused"),
        ("SET enable_external_access = true", "SET statement is refused"),
        ("RESET enable_external_access", "statement is refused"),
        ("SET autoinstall_known_extensions = true; SELECT * FROM read_json('https://example.com/x.json')",
         "SET statement is refused"),
        ("PRAGMA enable_profiling", "PRAGMA statement is refused"),
    ]


def test_a_statement_that_leaves_the_scan_is_one_line_and_installs_nothing(scanned, home, tmp_path, capsys):
    out, outside = scanned
    for sql, says in _cases(out, outside, tmp_path):
        line = one_line(capsys, ["corpus", out, "--sql", sql])
        assert list(home.iterdir()) == [], (sql, "DuckDB wrote under HOME (~/.duckdb/extensions)")
        assert says in line, (sql, line)
    assert not (out / "x.csv").exists() and not (tmp_path / "x.db").exists()
    assert cli.main(["corpus", str(out), "--sql", "SELECT count(*) AS n FROM heads"]) == 0  # the scan itself reads


def test_the_lock_holds_against_the_connection_itself(scanned, home):
    """Past the statement filter (the API's own connection), DuckDB refuses a setting turned back: the lock is
    DuckDB's, not only the filter's."""
    out, outside = scanned
    con = corpus.connect(out)
    for setting in ("enable_external_access = true", "autoinstall_known_extensions = true",
                    "autoload_known_extensions = true", "allowed_paths = ['/']", "lock_configuration = false"):
        with pytest.raises(Exception, match="locked"):
            con.execute(f"SET {setting}")
    with pytest.raises(InspectorError, match="--allow-external"):
        corpus.queries(con, f"SELECT * FROM read_csv({lit(outside)})")
    assert corpus.query(con, "SELECT count(*) AS n FROM documents").iloc[0, 0] == 10
    assert list(home.iterdir()) == []


def test_allow_external_opens_it_and_needs_sql(scanned, home, capsys):
    out, outside = scanned
    assert cli.main(["corpus", str(out), "--allow-external", "--sql", f"SELECT b FROM read_csv({lit(outside)})"]) == 0
    assert "2" in capsys.readouterr().out
    assert "give --sql QUERY too" in one_line(capsys, ["corpus", out, "--allow-external"])
    assert corpus.queries(out, f"SELECT a FROM read_csv({lit(outside)})", allow_external=True)[0][1].iloc[0, 0] == 1


def test_top_fetches_the_rows_it_prints(scanned, tmp_path):
    """``--top 3`` over ``range(10^8)`` (the whole result: 800 MB as one column, more as a frame) finishes with
    the peak memory of the process far below it, and says that more rows follow without counting them."""
    out, _ = scanned
    # the peak is VmHWM, this process's own high-water mark: ru_maxrss survives exec, so under a large parent (the
    # test run itself, 1.4 GB) it reports the parent's size
    code = ("import re, sys; from inspector.cli import main; "
            "rc = main(['corpus', sys.argv[1], '--sql', 'SELECT range AS i, range * 2 AS j FROM range(100000000)', "
            "'--top', '3']); "
            "print('PEAK', re.search(r'VmHWM:\\s*(\\d+)', open('/proc/self/status').read()).group(1)); sys.exit(rc)")
    done = subprocess.run([sys.executable, "-c", code, str(out)], capture_output=True, text=True, timeout=120,
                          cwd=ROOT, env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "HF_HUB_OFFLINE": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    peak = int(done.stdout.rsplit("PEAK", 1)[1]) << 10  # VmHWM is in KiB
    assert peak < PEAK_RSS, (peak >> 20, "MiB")
    assert "the first 3 rows shown, more follow" in done.stdout
    rows = [line.split() for line in done.stdout.splitlines() if line.split()[:1] in (["0"], ["1"], ["2"], ["3"])]
    assert [r[:2] for r in rows] == [["0", "0"], ["1", "2"], ["2", "4"]], done.stdout


def test_csv_still_writes_every_row(scanned, tmp_path):
    out, _ = scanned
    target = tmp_path / "all.csv"
    assert cli.main(["corpus", str(out), "--sql", "SELECT * FROM range(5000)", "--top", "2", "--csv", str(target)]) == 0
    assert len(target.read_text().splitlines()) == 5001
    assert corpus.queries(out, "SELECT * FROM range(10)", limit=2)[0][1]["range"].tolist() == [0, 1, 2]


def test_csv_to_standard_output_is_the_csv_alone(scanned, capsys):
    """``--csv -``: standard output holds the CSV and nothing after it (no table printed below)."""
    out, _ = scanned
    capsys.readouterr()
    assert cli.main(["corpus", str(out), "--sql", "SELECT * FROM range(4) AS t(n)", "--csv", "-"]) == 0
    assert capsys.readouterr().out.splitlines() == ["n", "0", "1", "2", "3"]


def test_the_spill_folder_in_the_working_directory_is_not_a_way_out(scanned, home, tmp_path, monkeypatch, capsys):
    """DuckDB's default spill folder (``./.tmp``) used to be on the allowed list: a file in it, or ``.tmp`` as a
    link to ``/etc``, could be read by ``--sql``. The connection spills nowhere, so no folder but the scan's is open."""
    out, _ = scanned
    work = tmp_path / "work"
    (work / ".tmp").mkdir(parents=True)
    (work / ".tmp" / "x.csv").write_text("a,b\n1,2\n")
    (work / "etc").symlink_to("/etc")
    monkeypatch.chdir(work)
    assert "reads only the scan's own files" in one_line(capsys, ["corpus", out, "--sql", "SELECT * FROM read_csv('.tmp/x.csv')"])
    assert "reads only the scan's own files" in one_line(
        capsys, ["corpus", out, "--sql", "SELECT * FROM read_csv('.tmp/../etc/passwd', header = false)"])
    assert cli.main(["corpus", str(out), "--sql", "SELECT value FROM duckdb_settings() WHERE name = 'allowed_directories'"]) == 0
    assert ".tmp" not in capsys.readouterr().out


def test_the_pushed_down_limit_keeps_the_querys_order_and_its_kinds(scanned):
    """--top wraps a query as a subquery with LIMIT: its ORDER BY still decides the rows, and DESCRIBE, SHOW and a
    query ending in a comment still run."""
    out, _ = scanned
    assert corpus.queries(out, "SELECT * FROM range(10) ORDER BY range DESC", limit=2)[0][1]["range"].tolist() == [9, 8, 7]
    full = corpus.queries(out, "SELECT id, site, head, split_score FROM heads ORDER BY split_score DESC, id, site, head")
    top = corpus.queries(out, "SELECT id, site, head, split_score FROM heads ORDER BY split_score DESC, id, site, head",
                         limit=4)
    pd.testing.assert_frame_equal(top[0][1], full[0][1].head(5))
    assert len(corpus.queries(out, "DESCRIBE heads", limit=2)[0][1]) == 3
    assert corpus.queries(out, "SELECT 1 AS a -- a comment", limit=2)[0][1]["a"].tolist() == [1]
