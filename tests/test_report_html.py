"""`hpcrl report RUN --html FILE`: one self-contained page, its plots inline, parsed here; opened in headless
Chromium where it is installed (the screenshot is kept in the test's tmp_path). The fixture run directories
are tests/data/runs/ (README.md there says what each holds); a real chain's page is checked in
tests/test_watch.py."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import assert_user_error
from watch_harness import FETCHES, Page

DATA = Path(__file__).parent / "data" / "runs"
CHAIN, BREAKER = DATA / "chain", DATA / "breaker"
PNG = b"\x89PNG\r\n\x1a\n"


def hpcrl(*args: str, cwd: Path | None = None):
    e = {k: v for k, v in os.environ.items() if not k.startswith("HPCRL_")}
    e.update(NO_COLOR="1", COLUMNS="200")
    return subprocess.run(
        [sys.executable, "-m", "hpcrl", *args], capture_output=True, text=True, env=e, cwd=cwd, timeout=120
    )


def page_of(run_dir: Path, tmp_path: Path) -> tuple[str, Page]:
    out = tmp_path / "report.html"
    proc = hpcrl("report", str(run_dir), "--html", str(out))
    assert proc.returncode == 0, proc.stderr
    assert f"html: {out}" in proc.stdout
    text = out.read_text()
    page = Page()
    page.feed(text)
    return text, page


def test_the_page_is_self_contained_with_its_plots_inline(tmp_path):
    text, page = page_of(CHAIN, tmp_path)
    assert FETCHES.search(text) is None, FETCHES.search(text).group(0)
    assert text.startswith("<!DOCTYPE html>") and page.tags.count("svg") == len(page.charts) >= 3
    # tests/data/runs/README.md: the job logs' panels are steps 5 (job 101), 6 and 7 (job 102).
    assert page.drawn(page.chart("Reward over steps")) == {"reward (scores)": 3}
    assert page.drawn(page.chart("Loss, KL, grad norm over steps")) == {
        "loss (loss/total_avg)": 3,
        "KL (loss/kl_avg)": 3,
    }
    # GPU memory: every node with GPU samples is drawn, n1 and n2; their samples are minutes apart, more than
    # the monitor's silence that breaks a line, so each shows as dots.
    drawn = page.drawn(page.chart("GPU memory over time, per node"))
    assert set(drawn) == {"n1", "n2"} and drawn["n1"] > 0 and drawn["n2"] > 0, drawn
    # The chain with its end reasons, and both checkpoints.
    for cell in ("101", "102", "timeout:0", "completed:0", "checkpoints/global_step6", "output_checkpoints/step_6"):
        assert cell in page.cells, cell


def test_a_run_that_was_stopped_by_the_breaker_and_has_no_gpu(tmp_path):
    text, page = page_of(BREAKER, tmp_path)
    assert "circuit breaker: zero_reward (exit 90, step 14)" in text
    assert "No GPU memory over time to plot: no GPU samples (the monitor found no NVIDIA GPU on n3)" in text
    assert "GPU memory over time" not in [c["title"] for c in page.charts]


def test_a_run_directory_that_never_started(tmp_path):
    run_dir = tmp_path / "never"
    (run_dir / "hpcrl").mkdir(parents=True)
    text, _ = page_of(run_dir, tmp_path)
    assert "No job recorded in hpcrl/jobs.tsv: the run never started." in text
    assert "No training step in the job logs (no job log)" in text
    assert FETCHES.search(text) is None


def test_headless_chromium_draws_the_page(tmp_path):
    browser = next((b for b in ("chromium", "chromium-browser", "google-chrome") if shutil.which(b)), None)
    if browser is None:
        pytest.skip("no Chromium here (CI installs only what .ci/run installs; apt-get install chromium)")
    page_of(CHAIN, tmp_path)
    shot = tmp_path / "report.png"
    proc = subprocess.run(
        [
            browser,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            f"--user-data-dir={tmp_path / 'profile'}",
            f"--screenshot={shot}",
            "--window-size=1000,1400",
            (tmp_path / "report.html").as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = shot.read_bytes()
    assert data[:8] == PNG
    assert (int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")) == (1000, 1400)
    print(f"screenshot: {shot}")


# --------------------------------------------------------------------------- where the page goes


@pytest.mark.parametrize(
    "target, says",
    [
        ("dir", ": a directory;"),
        ("/dev/null", ": a character device;"),
        ("fifo", ": a FIFO"),
        ("missing/report.html", "/missing does not exist"),
    ],
)
def test_a_target_that_is_no_regular_file_is_refused(tmp_path, target, says):
    (tmp_path / "dir").mkdir()
    os.mkfifo(tmp_path / "fifo")
    path = target if target.startswith("/") else str(tmp_path / target)
    before = sorted(p.name for p in tmp_path.iterdir())
    assert_user_error(hpcrl("report", str(CHAIN), "--html", path), says)
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_an_existing_file_is_replaced_whole_and_keeps_its_mode(tmp_path):
    out = tmp_path / "report.html"
    out.write_text("old\n")
    out.chmod(0o640)
    assert hpcrl("report", str(CHAIN), "--html", str(out)).returncode == 0
    assert out.read_text().startswith("<!DOCTYPE html>") and oct(out.stat().st_mode & 0o777) == "0o640"
    assert [p.name for p in tmp_path.iterdir()] == ["report.html"]  # no temporary file left beside it
