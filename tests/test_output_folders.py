"""Output folders are inspector's only when they say so (issue 40): `debug -o` and `demo -o` replace a folder whole
only where its marker (.inspector.json, written last by the run, listing every file it wrote) says inspector wrote
it; a user's folder holding a report.html, an older version's folder, a marked folder a user added a file to, a
file, a dangling link are refused in one line (exit 2) and kept byte for byte; a link is followed, never replaced;
two runs into one folder leave one run's folder whole. `scan -o` writes into its folder: a non-empty folder that is
not a scan is refused, a link followed the same way. The real commands throughout (inspector.cli.main), on the
trained summariser fixtures/parties/seq2seq where a run must finish; a seeded fuzz test of the rules at the end."""

from __future__ import annotations

import contextlib
import json
import os
import random
import stat
import subprocess
from pathlib import Path

import pytest

from inspector.cli import main
from inspector.errors import InspectorError
from inspector.investigate.defaults import MARKER, REPORT

ROOT = Path(__file__).resolve().parent.parent
PARTIES = ROOT / "fixtures" / "parties" / "seq2seq"
SOURCE = "the seller shall repay the costs of the lessor ."
SAID = "the lessor shall reimburse the seller"
RUN_FILES = {MARKER, "capture.safetensors", "output.txt", "rank.csv", REPORT, "source.txt", "split.csv"}
SENTINEL = "sentinel: the model would load here"


def debug(out, *extra) -> list[str]:
    return ["debug", "--model", str(PARTIES), "--source", SOURCE, "--output", SAID, "--query", "reimburse",
            "--referents", "seller,lessor", *map(str, extra), "-o", str(out)]


def one_line(capsys) -> str:
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("inspector: error:") and "Traceback" not in err, err
    return lines[0]


def last_line(capsys) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    return err.strip().splitlines()[-1]


def tree(root: Path) -> dict[str, tuple]:
    """Everything under ``root``, links not followed: each entry's kind, bytes or link text, and permissions."""
    out: dict[str, tuple] = {}

    def walk(folder: Path, rel: str) -> None:
        for e in sorted(os.scandir(folder), key=lambda e: e.name):
            r = f"{rel}/{e.name}" if rel else e.name
            if e.is_symlink():
                out[r] = ("link", os.readlink(e.path))
            elif e.is_dir():
                out[r] = ("dir", stat.S_IMODE(e.stat().st_mode))
                walk(Path(e.path), r)
            else:
                out[r] = ("file", Path(e.path).read_bytes(), stat.S_IMODE(e.stat().st_mode))

    walk(root, "")
    return out


def marked_files(folder: Path) -> set[str]:
    """The folder's files, after checking that its marker is inspector's and lists exactly them."""
    info = json.loads((folder / MARKER).read_text())
    assert info["written_by"] == "inspector" and info["version"] and info["command"] in ("debug", "demo"), info
    names = {p.name for p in folder.iterdir()}
    assert all((folder / n).is_file() and not (folder / n).is_symlink() for n in names)
    assert set(info["files"]) == names - {MARKER}, (info["files"], names)
    return names


@pytest.fixture(scope="module")
def seq2seq():
    from inspector.capture.models import load_model

    return load_model(str(PARTIES))


@pytest.fixture
def model(seq2seq, monkeypatch):
    """debug's model is the summariser, loaded once for the module; ``calls`` counts the loads asked for."""
    calls = []

    def load(args):
        calls.append(args.model)
        return seq2seq

    monkeypatch.setattr("inspector.cli.investigate.load_from_args", load)
    return calls


@pytest.fixture
def no_model(monkeypatch):
    """Any model load is a failure: the folder must be refused before it."""
    def fail(*_a, **_k):
        raise AssertionError("the model was loaded before the output folder was checked")

    for where in ("inspector.cli.investigate.load_from_args", "inspector.capture.models.load_model"):
        monkeypatch.setattr(where, fail)


# ---- a user's folder, an older version's folder, a file ----------------------------------------------
def test_a_users_folder_with_a_report_html_is_refused_and_kept(tmp_path, no_model, capsys):
    """The issue's example: `mkdir site; echo mine > site/report.html; echo notes > site/precious.txt; debug -o site`
    exited 0 and precious.txt was gone (report.html was taken for an earlier investigation)."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "report.html").write_text("mine\n")
    (site / "precious.txt").write_text("notes\n")
    before = tree(tmp_path)
    for argv in (debug(site), ["demo", "--no-app", "-o", str(site)]):
        assert main(argv) == 2
        line = one_line(capsys)
        assert MARKER in line and "move the folder away or delete it yourself" in line, line
        assert tree(tmp_path) == before


def test_an_older_versions_folder_is_refused_with_how_to_proceed(tmp_path, no_model, capsys):
    old = tmp_path / "lease"
    old.mkdir()
    for name in ("report.html", "rank.csv", "split.csv", "capture.safetensors"):  # as 0.2.0 wrote it: no marker
        (old / name).write_bytes(f"an earlier {name}\n".encode())
    before = tree(tmp_path)
    assert main(debug(old)) == 2
    line = one_line(capsys)
    assert "an older inspector wrote it" in line and "delete it yourself" in line, line
    assert tree(tmp_path) == before


def test_a_folder_of_other_files_a_file_and_a_dangling_link_are_refused(tmp_path, no_model, capsys):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "thesis.tex").write_text("keep me")
    (tmp_path / "results").write_text("a file")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    (tmp_path / "to-a-file").symlink_to(tmp_path / "results")
    before = tree(tmp_path)
    for out, said in ((mine, "other files in it"), (tmp_path / "results", "is not a folder"),
                      (tmp_path / "dangling", "which does not exist"), (tmp_path / "to-a-file", "is not a folder")):
        for argv in (debug(out), ["demo", "--no-app", "-o", str(out)]):
            assert main(argv) == 2
            assert said in one_line(capsys)
    assert tree(tmp_path) == before  # the dangling link still dangles: nothing was created where it points


def test_a_read_only_parent_is_refused_before_the_model_and_the_earlier_run_kept(tmp_path, no_model, capsys):
    ro = tmp_path / "ro"
    ro.mkdir()
    if os.geteuid() == 0:
        if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(ro)], capture_output=True).returncode:
            pytest.skip("running as root, where chmod does not block writes, and mount -t tmpfs is not permitted here")
    try:
        earlier = ro / "out"
        earlier.mkdir()
        (earlier / "rank.csv").write_text("site,head\nx,1\n")
        from inspector.store.files import write_marker

        write_marker(earlier, MARKER, {"command": "debug", "version": "0.2.0"})
        if os.geteuid() == 0:
            subprocess.run(["mount", "-o", "remount,ro", str(ro)], check=True)
        else:
            ro.chmod(0o555)
        before = tree(ro)
        for argv in (debug(earlier), ["demo", "--no-app", "-o", str(earlier)]):
            assert main(argv) == 2
            line = one_line(capsys)
            assert "could not write" in line and "write elsewhere" in line, line
            assert tree(ro) == before
    finally:
        if os.geteuid() == 0:
            subprocess.run(["umount", str(ro)], check=False)
        else:
            ro.chmod(0o755)


def test_the_current_folder_is_refused(tmp_path, no_model, capsys, monkeypatch):
    from inspector.store.files import write_marker

    here = tmp_path / "run"
    here.mkdir()
    write_marker(here, MARKER, {"command": "debug", "version": "0.2.0"})
    monkeypatch.chdir(here)
    assert main(debug(".")) == 2
    assert "the current folder" in one_line(capsys)


# ---- links ------------------------------------------------------------------------------------------
def test_a_link_is_followed_never_replaced(tmp_path, model, capsys):
    """`-o link` left `.link.XXXX.old` (the link, renamed aside) and a folder in the link's place."""
    real = tmp_path / "real"
    real.mkdir()
    link = tmp_path / "link"
    link.symlink_to(real)
    for _ in range(2):  # into the empty folder it points to, then over that run
        assert main(debug(link)) == 0, capsys.readouterr().err
        assert link.is_symlink() and os.readlink(link) == str(real)
        assert marked_files(real) == RUN_FILES
        assert sorted(p.name for p in tmp_path.iterdir()) == ["link", "real"]  # no .link.*.old, no .real.*.new
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep")
    link.unlink()
    link.symlink_to(mine)
    before = tree(tmp_path)
    assert main(debug(link)) == 2
    assert "(a link to" in one_line(capsys)
    assert tree(tmp_path) == before


# ---- earlier runs -----------------------------------------------------------------------------------
def test_an_earlier_run_is_replaced_whole(tmp_path, model, capsys):
    variant = tmp_path / "quoted.txt"
    variant.write_text("the seller shall repay the costs of the lessor , it says .")
    out = tmp_path / "out"
    # another run's hidden leftovers beside it are not this run's: never touched
    for name in (".out.abcd1234.old", ".out.efgh5678.new"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "precious.txt").write_text("not inspector's to delete")
    assert main(debug(out, "--variant", f"quoted={variant}")) == 0, capsys.readouterr().err
    first = marked_files(out)
    assert {"variant-quoted.safetensors", "compare-quoted.csv"} <= first
    others = {k: v for k, v in tree(tmp_path).items() if not k.startswith("out")}
    assert main(debug(out)) == 0, capsys.readouterr().err  # the second run, without the variant
    assert marked_files(out) == RUN_FILES  # nothing of the first is left, nothing mixed in
    assert {k: v for k, v in tree(tmp_path).items() if not k.startswith("out")} == others


def test_a_marked_folder_that_a_user_added_to_is_refused(tmp_path, model, capsys):
    out = tmp_path / "out"
    assert main(debug(out)) == 0, capsys.readouterr().err
    (out / "my-notes.txt").write_text("what I found")
    before = tree(tmp_path)
    assert main(debug(out)) == 2
    assert "'my-notes.txt', which inspector did not write" in one_line(capsys)
    assert tree(tmp_path) == before
    (out / "my-notes.txt").unlink()
    (out / "rank.csv").unlink()
    (out / "rank.csv").mkdir()  # a listed name that is no longer the file inspector wrote
    before = tree(tmp_path)
    assert main(debug(out)) == 2
    assert "rank.csv is a folder" in one_line(capsys)
    assert tree(tmp_path) == before


def test_a_file_added_while_the_run_works_is_kept_and_the_run_refused(tmp_path, model, capsys, monkeypatch):
    """The folder is checked again when the new one goes in: what stopped being inspector's meanwhile is kept."""
    import inspector.investigate.debug as dbg

    out = tmp_path / "out"
    assert main(debug(out)) == 0, capsys.readouterr().err
    real = dbg.write_csv

    def write_csv(path, df):
        if Path(path).name == "split.csv":
            (out / "added.txt").write_text("written while the run worked")
        return real(path, df)

    monkeypatch.setattr(dbg, "write_csv", write_csv)
    assert main(debug(out)) == 2
    assert "'added.txt', which inspector did not write" in one_line(capsys)
    assert (out / "added.txt").read_text() == "written while the run worked"
    assert {p.name for p in out.iterdir()} == RUN_FILES | {"added.txt"}  # the earlier run's files, as they were
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # the new folder was removed


# ---- two runs into one folder -----------------------------------------------------------------------
def test_a_run_that_finishes_while_another_works_is_replaced_whole(tmp_path, model, capsys, monkeypatch):
    import inspector.investigate.debug as dbg

    variant = tmp_path / "quoted.txt"
    variant.write_text("the seller shall repay the costs of the lessor , it says .")
    out = tmp_path / "out"
    real, seen = dbg.write_csv, []

    def write_csv(path, df):
        if Path(path).name == "split.csv" and not seen:
            seen.append(path)  # run B, with a variant, starts and finishes while run A builds its folder
            assert main(debug(out, "--variant", f"quoted={variant}")) == 0
            assert "variant-quoted.safetensors" in marked_files(out)
        return real(path, df)

    monkeypatch.setattr(dbg, "write_csv", write_csv)
    assert main(debug(out)) == 0, capsys.readouterr().err
    assert marked_files(out) == RUN_FILES  # A's folder whole, nothing of B's
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "quoted.txt"]


def test_a_run_that_lands_between_the_renames_is_replaced_whole(tmp_path, model, capsys, monkeypatch):
    """Run B puts its folder in place just after run A moved the earlier one aside: A's rename-in then finds the
    place taken. Before, A tried to put the earlier folder back, failed, and left `.out.*.old` and exit 2."""
    variant = tmp_path / "quoted.txt"
    variant.write_text("the seller shall repay the costs of the lessor , it says .")
    out = tmp_path / "out"
    assert main(debug(out)) == 0, capsys.readouterr().err
    target, real, seen = os.path.realpath(out), os.rename, []

    def rename(src, dst):
        real(src, dst)
        if os.fspath(src) == target and not seen:  # A just moved the earlier folder aside
            seen.append(dst)
            assert main(debug(out, "--variant", f"quoted={variant}")) == 0  # B, whole
            assert "variant-quoted.safetensors" in marked_files(out)

    monkeypatch.setattr(os, "rename", rename)
    assert main(debug(out)) == 0, capsys.readouterr().err
    assert seen and marked_files(out) == RUN_FILES  # A's, whole: B's went as the earlier one did
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "quoted.txt"]


def test_an_interrupted_swap_puts_the_earlier_folder_back(tmp_path, model, capsys, monkeypatch):
    out = tmp_path / "out"
    assert main(debug(out)) == 0, capsys.readouterr().err
    before = tree(tmp_path)
    real = os.rename

    def rename(src, dst):
        if os.fspath(src).endswith(".new"):  # Ctrl-C (or SIGTERM) between moving the old folder aside and the new in
            raise KeyboardInterrupt
        return real(src, dst)

    monkeypatch.setattr(os, "rename", rename)
    assert main(debug(out)) == 130
    assert tree(tmp_path) == before


def test_the_swap_takes_a_place_freed_by_another_run(tmp_path):
    """Another run moves the folder away between this one's check and its move: no error, nothing left over."""
    from inspector.store import files

    out = tmp_path / "out"
    with files.swap_folder(out, MARKER, {"command": "debug"}) as work:
        (work / "a.txt").write_text("first")
    real = files._folder_state

    def moved_away_after_the_check(target, *args):
        state = real(target, *args)
        if state == "ours":
            os.rename(target, tmp_path / "gone")
            files._folder_state = real
        return state

    files._folder_state = moved_away_after_the_check
    try:
        with files.swap_folder(out, MARKER, {"command": "debug"}) as work:
            (work / "b.txt").write_text("second")
    finally:
        files._folder_state = real
    assert (out / "b.txt").read_text() == "second" and not (out / "a.txt").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gone", "out"]
    with pytest.raises(InspectorError, match="not a marker inspector wrote"):
        files.add_to_marker(tmp_path, MARKER, ["x"])



def test_a_file_edited_since_the_run_wrote_it_is_refused_and_kept(tmp_path, capsys):
    """The marker records each written file's sha256: a rerun refuses (one line naming the file and the fix, nothing
    touched) where a listed file's content changed; an older marker without hashes is replaced as before."""
    from inspector.store import files

    out = tmp_path / "out"
    with files.swap_folder(out, MARKER, {"command": "debug"}) as work:
        (work / "report.html").write_text("first")
        (work / "notes.csv").write_text("a,b\n")
    marker = json.loads((out / MARKER).read_text())
    assert set(marker["sha256"]) == {"report.html", "notes.csv"} and len(marker["sha256"]["notes.csv"]) == 64
    (out / "notes.csv").write_text("a,b\nmy own note\n")
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    with pytest.raises(InspectorError, match=r"notes\.csv changed since inspector wrote it") as info:
        with files.swap_folder(out, MARKER, {"command": "debug"}) as work:
            raise AssertionError("refused before any work")
    assert "another folder" in str(info.value) and "delete it" in str(info.value) and "\n" not in str(info.value)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    # the command line says it in one line, exit 2, before the model loads
    assert main(["debug", "--source", "a pays b", "--query", "pays", "--referents", "a,b", "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "notes.csv changed since inspector wrote it" in err[0]
    # an older marker (file names only) keeps working: the folder is replaced whole
    del marker["sha256"]
    (out / MARKER).write_text(json.dumps(marker))
    with files.swap_folder(out, MARKER, {"command": "debug"}) as work:
        (work / "report.html").write_text("second")
    assert sorted(p.name for p in out.iterdir()) == [MARKER, "report.html"]

# ---- demo --------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_demo_lists_its_storys_tables_so_the_next_demo_replaces_them(tmp_path, capsys, monkeypatch):
    """The demo's story writes variants.csv (and sources.csv) after its investigation is in place; the marker lists
    them, so the next `demo -o` into the folder is accepted (it gets as far as loading the model) and a user's file
    there is refused."""
    out = tmp_path / "demo"
    assert main(["demo", "--no-app", "-o", str(out)]) == 0, capsys.readouterr().err
    capsys.readouterr()
    names = marked_files(out)
    assert {"variants.csv", "sources.csv", REPORT} <= names and json.loads((out / MARKER).read_text())["command"] == "demo"

    def sentinel(*_a, **_k):
        raise InspectorError(SENTINEL)

    monkeypatch.setattr("inspector.capture.models.load_model", sentinel)
    assert main(["demo", "--no-app", "-o", str(out)]) == 2
    assert last_line(capsys) == f"inspector: error: {SENTINEL}"
    (out / "keep.txt").write_text("mine")
    assert main(["demo", "--no-app", "-o", str(out)]) == 2
    assert "'keep.txt', which inspector did not write" in one_line(capsys)


# ---- scan ---------------------------------------------------------------------------------------------
@pytest.fixture
def corpus(tmp_path_factory) -> Path:
    data = tmp_path_factory.mktemp("corpus") / "docs.jsonl"
    data.write_text('{"text": "The Lessee shall pay the Lessor."}\n{"text": "The Lessor shall notify the Lessee."}\n')
    return data


def test_scan_refuses_a_folder_that_is_not_a_scan_and_follows_links(tmp_path, corpus, capsys, monkeypatch):
    def sentinel(*_a, **_k):
        raise InspectorError(SENTINEL)

    monkeypatch.setattr("inspector.capture.models.load_model", sentinel)
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "report.html").write_text("mine")
    (tmp_path / "to-mine").symlink_to(mine)
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    empty = tmp_path / "empty"
    empty.mkdir()
    (tmp_path / "to-empty").symlink_to(empty)
    before = tree(tmp_path)
    for out, said in ((mine, "is not empty and holds no scan"), (tmp_path / "to-mine", "is not empty and holds no scan"),
                      (tmp_path / "dangling", "which does not exist")):
        assert main(["scan", str(corpus), "-o", str(out)]) == 2
        assert said in one_line(capsys)
        assert tree(tmp_path) == before
    # a link to an empty folder is followed: the scan gets as far as the model, nothing written in the link's place
    assert main(["scan", str(corpus), "-o", str(tmp_path / "to-empty")]) == 2
    assert last_line(capsys) == f"inspector: error: {SENTINEL}"
    assert tree(tmp_path) == before


def test_scan_writes_where_a_link_points(tmp_path, corpus, tokenizer, capsys):
    import tiny

    model = tmp_path / "tiny-bert"
    tiny.build("bert").save_pretrained(model)
    tokenizer.save_pretrained(model)
    real = tmp_path / "real"
    real.mkdir()
    link = tmp_path / "link"
    link.symlink_to(real)
    assert main(["scan", str(corpus), "-o", str(link), "--model", str(model)]) == 0, capsys.readouterr().err
    assert link.is_symlink() and (real / "scan.json").is_file() and (real / "documents.parquet").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link", "real", "tiny-bert"]


# ---- fuzz ---------------------------------------------------------------------------------------------
CASES = 160
SEED = 40
TARGETS = {"absent": 1, "empty": 1, "link-empty": 1, "tree": 12, "link-tree": 4, "file": 1, "link-file": 1,
           "link-dangling": 1, "link-loop": 1}
ENTRY_NAMES = ["rank.csv", REPORT, "precious.txt", "capture.safetensors", "sub", ".hidden", "notes.md", "split.csv"]
ENTRY_KINDS = ["file", "file", "file", "folder", "link-file", "link-folder", "link-dangling"]
MARKERS = ["none", "none", "valid", "valid", "valid", "valid-subset", "valid-superset", "garbage", "foreign", "folder",
           "link", "empty"]
FOREIGN = [b'{"written_by": "someone else", "files": []}', b'["written_by", "inspector"]', b'{"files": []}',
           b'{"written_by": "inspector", "files": "rank.csv"}', b'{"written_by": "inspector", "files": ["../x"]}',
           b"null", b'{"written_by": "inspector"}', b'{"written_by": "inspector", "files": [1, 2]}',
           b'{"written_by": "Inspector", "files": []}']


def _entry(folder: Path, name: str, kind: str, elsewhere: Path, rng: random.Random) -> None:
    p = folder / name
    if kind == "file":
        p.write_bytes(rng.randbytes(rng.randint(0, 24)))
    elif kind == "folder":
        p.mkdir()
        (p / "inner.txt").write_bytes(rng.randbytes(8))
    elif kind == "link-file":
        p.symlink_to(elsewhere / "a-file.txt")
    elif kind == "link-folder":
        p.symlink_to(elsewhere / "a-folder")
    else:
        p.symlink_to(elsewhere / "missing")


def _marker(folder: Path, kind: str, names: list[str], elsewhere: Path, rng: random.Random) -> set[str] | None:
    """Write a marker of ``kind``; the names it validly lists, or None where it is no valid marker."""
    valid = {"valid": names, "valid-subset": names[1:], "valid-superset": [*names, "extra.csv"]}
    if kind in valid:
        listed = valid[kind]
        (folder / MARKER).write_text(json.dumps({"written_by": "inspector", "command": "debug", "version": "0.1.0",
                                                 "files": listed}))
        return set(listed)
    if kind == "garbage":
        (folder / MARKER).write_bytes(rng.randbytes(rng.randint(1, 40)))
    elif kind == "empty":
        (folder / MARKER).write_bytes(b"")
    elif kind == "foreign":
        (folder / MARKER).write_bytes(rng.choice(FOREIGN))
    elif kind == "folder":
        (folder / MARKER).mkdir()
    elif kind == "link":  # a valid marker, but elsewhere: a link is no marker
        (elsewhere / "marker.json").write_text(json.dumps({"written_by": "inspector", "files": names}))
        (folder / MARKER).symlink_to(elsewhere / "marker.json")
    return None


def _fill(folder: Path, elsewhere: Path, rng: random.Random) -> tuple[bool, bool]:
    """A random tree in ``folder``: (may inspector replace it, is it empty)."""
    names = rng.sample(ENTRY_NAMES, rng.randint(0, 4))
    kinds = {n: rng.choice(ENTRY_KINDS) for n in names}
    for n, k in kinds.items():
        _entry(folder, n, k, elsewhere, rng)
    marker = rng.choice(MARKERS)
    listed = _marker(folder, marker, names, elsewhere, rng)
    if marker == "none":
        return not names, not names
    ok = listed is not None and set(names) <= listed and all(k == "file" for k in kinds.values())
    return ok, False


def _case(sandbox: Path, rng: random.Random) -> tuple[str, bool, bool]:
    """A random output target ``sandbox/out``: (its kind, may debug replace it, may scan write into it)."""
    elsewhere = sandbox / "elsewhere"
    (elsewhere / "a-folder").mkdir(parents=True)
    (elsewhere / "a-folder" / "x.txt").write_bytes(rng.randbytes(8))
    (elsewhere / "a-file.txt").write_bytes(rng.randbytes(8))
    out = sandbox / "out"
    kind = rng.choices(list(TARGETS), weights=list(TARGETS.values()))[0]
    folder = elsewhere / "real" if kind.startswith("link-") else out
    ok = empty = False
    if kind == "absent":
        ok = empty = True
    elif kind == "file":
        out.write_bytes(rng.randbytes(12))
    elif kind in ("empty", "link-empty"):
        folder.mkdir()
        ok = empty = True
    elif kind in ("tree", "link-tree"):
        folder.mkdir()
        ok, empty = _fill(folder, elsewhere, rng)
    if kind.startswith("link-"):
        link_to = {"link-file": elsewhere / "a-file.txt", "link-dangling": sandbox / "nowhere", "link-loop": out}
        out.symlink_to(link_to.get(kind, folder))
    return kind, ok, empty


@contextlib.contextmanager
def _sentinel_models(monkeypatch):
    """demo and scan stop where they would load their model: what they checked before it is what is tested."""
    def sentinel(*_a, **_k):
        raise InspectorError(SENTINEL)

    with monkeypatch.context() as m:
        m.setattr("inspector.capture.models.load_model", sentinel)
        yield


def _refused(capsys, before: dict, sandbox: Path) -> None:
    one_line(capsys)
    assert tree(sandbox) == before


def test_fuzz_the_output_folder_rules(tmp_path, model, corpus, capsys, monkeypatch):
    """Random trees at the output path (files, folders, links to files, folders and nowhere, a link loop; markers
    valid, listing too little or more, garbage, empty, another program's JSON, a folder, a link): each command
    either refuses in one line with exit 2 and leaves the tree byte for byte as it was, or (debug) succeeds and has
    replaced only a folder whose valid marker listed every entry in it, the rest of the tree untouched, a link still
    the same link; demo follows the same rules (it stops at its model load), scan writes only into an empty one."""
    rng = random.Random(SEED)
    counts = {"cases": 0, "replaced": 0, "refused": 0}
    for i in range(CASES):
        sandbox = tmp_path / f"case{i:03d}"
        sandbox.mkdir()
        kind, ok, empty = _case(sandbox, rng)
        out = sandbox / "out"
        before = tree(sandbox)
        with _sentinel_models(monkeypatch):
            rc = main(["scan", str(corpus), "-o", str(out)])
            assert rc == 2 and (last_line(capsys) == f"inspector: error: {SENTINEL}") == empty, (i, kind)
            assert tree(sandbox) == before, (i, kind)
            rc = main(["demo", "--no-app", "-o", str(out)])
            line = last_line(capsys)
            assert rc == 2 and (line == f"inspector: error: {SENTINEL}") == ok, (i, kind, line)
            assert tree(sandbox) == before, (i, kind)
        resolved = Path(os.path.realpath(out)) if ok else None
        rc = main(debug(out))
        counts["cases"] += 1
        if not ok:
            assert rc == 2, (i, kind, before)
            _refused(capsys, before, sandbox)
            counts["refused"] += 1
            continue
        assert rc == 0, (i, kind, capsys.readouterr().err)
        capsys.readouterr()
        counts["replaced"] += 1
        assert marked_files(resolved) == RUN_FILES, (i, kind)
        rel = resolved.relative_to(sandbox).as_posix()
        after = tree(sandbox)
        outside = {k: v for k, v in before.items() if k != rel and not k.startswith(rel + "/")}
        assert {k: v for k, v in after.items() if k != rel and not k.startswith(rel + "/")} == outside, (i, kind)
    assert counts["replaced"] >= 20 and counts["refused"] >= 80, counts
    print(f"output-folder fuzz: {counts}")
