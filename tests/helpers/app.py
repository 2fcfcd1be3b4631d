"""The Streamlit app driven headless (``streamlit.testing.v1.AppTest``), as every app test drives it: the steps (run a
page, open a file, find split heads), the errors shown, the files behind download buttons."""

from __future__ import annotations

import logging
from pathlib import Path

from streamlit.runtime.memory_media_file_storage import MemoryMediaFileStorage
from streamlit.testing.v1 import AppTest

# AppTest warns "missing ScriptRunContext" whenever a test sets session state between runs; that is expected
logging.getLogger("streamlit.runtime.scriptrunner_utils.script_run_context").setLevel(logging.ERROR)

ROOT = Path(__file__).resolve().parents[2]  # the checkout
APP = ROOT / "apps" / "app.py"
FIXTURE = ROOT / "fixtures" / "worked_example.safetensors"
TIMEOUT = 120  # the first capture in a process loads the MiniLM


class RecordingStorage(MemoryMediaFileStorage):
    """The media storage AppTest uses, keeping every file a download button registers."""

    files: dict[str, bytes] = {}

    def load_and_get_id(self, path_or_data, mimetype, kind, filename=None):
        file_id = super().load_and_get_id(path_or_data, mimetype, kind, filename)
        RecordingStorage.files[file_id] = self._files_by_id[file_id].content
        return file_id


def download(at: AppTest, key: str) -> bytes:
    """The bytes behind the download button ``key`` of the last run."""
    url = at.get("download_button")
    button = next(b for b in url if b.key == key)
    file_id = Path(button.proto.url).stem
    return RecordingStorage.files[file_id]


def run(at: AppTest) -> AppTest:
    at.run()
    assert not at.exception, at.exception
    return at


PAGES = {"Overview": "overview.py", "Head": "head.py", "Step by step": "steps.py", "Split finder": "split.py",
         "Compare": "compare.py", "bertviz": "bertviz_view.py", "Routes": "routes_page.py"}


def show(at: AppTest, view: str) -> AppTest:
    at.switch_page(PAGES[view])
    return run(at)


def open_file(at: AppTest, path: Path | str) -> AppTest:
    at.text_input(key="open_path").set_value(str(path))
    next(b for b in at.button if b.label == "Open").click()
    return run(at)


def split(at: AppTest, query: str, referents: str) -> AppTest:
    show(at, "Split finder")
    at.text_input(key="sp_query").set_value(query)
    at.text_input(key="sp_refs").set_value(referents)
    next(b for b in at.button if b.label == "Find split heads").click()
    return run(at)


def errors(at: AppTest) -> list[str]:
    return [e.value for e in at.error]
