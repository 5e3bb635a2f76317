"""The interactive HTML explorer (pipeoffload.viz.html): the page's data and its
self-containment in Python, then the page itself in a real headless Chromium.

The browser is driven over Chromium's DevTools protocol on ``--remote-debugging-pipe``
(file descriptors 3 and 4, NUL-terminated JSON messages): no port, no network, no
Python package beyond the standard library (:class:`Chromium` below). Chromium comes
from the system's packages; ``make test`` installs it when missing. Without it the
browser tests fail, saying so (CI must run them; PIPEOFFLOAD_ALLOW_MISSING=1 skips them
instead); a Chromium that is present but fails is an error.

``PIPEOFFLOAD_DOCS_SCREENSHOTS=1 pytest tests/test_html.py -k screenshot`` rewrites the
screenshots of the simulated-timeline and compare pages in docs/ (docs/explorer.md).
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from pipeoffload.cli import main
from pipeoffload.costs import Costs, MemoryDeltas
from pipeoffload.ir import Op, OpKind
from pipeoffload.passes.timing import simulate
from pipeoffload.schedules import generate
from pipeoffload.studies.compare import compare
from pipeoffload.timeline import TimedOp, Timeline
from pipeoffload.viz import KIND_COLORS, boxes
from pipeoffload.viz.html import (
    comparison_timelines,
    compare_html,
    measured_html,
    op_errors,
    timeline_html,
    write_measured_html,
    write_timeline_html,
)

from helpers import assert_imports_no_torch

DOCS = Path(__file__).resolve().parent.parent / "docs"


def _tl(name: str, p: int = 4, m: int = 8, **kw) -> Timeline:
    return simulate(generate(name, p=p, m=m, **kw), Costs())


def _page_data(page: str) -> dict:
    m = re.search(r'<script type="application/json" id="po-data">(.*?)</script>', page, re.S)
    assert m, "no data element"
    return json.loads(m.group(1))


def _measured_pair(p: int = 4, m: int = 8, factor: float = 1.5) -> tuple[Timeline, Timeline]:
    """A predicted timeline (seconds, bytes) and a "measured" one: every op ``factor`` times
    as long, each rank's ops in the predicted order, back to back from 100 s on, plus a
    send after every forward but the last rank's (the comm lane)."""
    sched = generate("group-interleaved", p=p, m=m)
    pred = simulate(sched, Costs(F=0.010, B=0.011, W=0.008), MemoryDeltas(F=2**20, B=0, W=-2**20), memory_unit="bytes")
    pred.name = "group-interleaved (predicted)"
    pred.meta["time_unit"] = "s"
    events = []
    for r in range(p):
        t = 100.0
        for e in pred.rank_events(r):
            s = max(t, 100.0 + e.start * factor)
            events.append(TimedOp(e.op, s, s + e.duration * factor, e.stream, e.mem))
            t = s + e.duration * factor
            if e.op.kind is OpKind.F and r < p - 1:
                o = e.op
                events.append(TimedOp(Op(OpKind.SEND_F, o.stage, o.microbatch, r, o.chunk, peer=r + 1), t, t + 1e-4,
                                      "comm", 0.0))
    meas = Timeline(p, events, "group-interleaved (measured)", m, sched.chunks, "bytes",
                    meta={"time_unit": "s", "measured": True, "params": dict(sched.params),
                          "step_time": [0.5] * p})
    return meas, pred


# --- the page, read as text ------------------------------------------------------------------


def _pages() -> dict[str, str]:
    cmp = compare(4, 8)
    meas, pred = _measured_pair()
    return {"timeline": timeline_html(_tl("zb-h1")), "compare": compare_html(cmp), "measured": measured_html(meas, pred)}


@pytest.mark.parametrize("kind", ["timeline", "compare", "measured"])
def test_page_is_self_contained(kind: str) -> None:
    """No network: no URL, no external script, style, font or image; a policy that forbids loading any."""
    page = _pages()[kind]
    low = page.lower()
    for needle in ("http://", "https://", "//cdn", "<link", "<img", "<iframe", "@import", "url(", "src=", "fetch(",
                   "xmlhttprequest", "websocket", "import("):
        assert needle not in low, needle
    assert low.count("<script") == 2  # the data and the explorer, both inline
    assert "default-src 'none'" in page
    assert f'<body data-page="{kind}">' in page
    assert _page_data(page)["kind"] == kind


def test_timeline_data_ops_and_memory_after() -> None:
    """One op entry per box; ``after`` is the memory when the op ends, by hand for 1F1B p=2 m=2."""
    tl = _tl("1f1b", p=2, m=2)
    d = _page_data(timeline_html(tl))["timelines"][0]
    ops = d["ops"]
    assert len(ops["start"]) == len(boxes(tl)) == 8
    assert d["kinds"] == ["F", "BW"] and d["lanes"] == ["compute"]
    got = {(ops["rank"][i], d["kinds"][ops["kind"][i]], ops["mb"][i]): (ops["start"][i], ops["end"][i], ops["after"][i])
           for i in range(8)}
    # F = 1, BW = 2 units; +1 per forward, −1 per backward; stage 1 runs on rank 1.
    assert got == {
        (0, "F", 0): (0, 1, 1), (0, "F", 1): (1, 2, 2), (1, "F", 0): (1, 2, 1), (1, "BW", 0): (2, 4, 0),
        (1, "F", 1): (4, 5, 1), (0, "BW", 0): (4, 6, 1), (1, "BW", 1): (5, 7, 0), (0, "BW", 1): (7, 9, 0),
    }
    assert d["peaks"] == [2, 1] and d["memory"][0] == [[0, 1, 6, 9], [1, 2, 1, 0]]  # allocated as F starts
    assert d["bubbles"] == pytest.approx(tl.rank_bubble_rates(), rel=1e-5)  # 6 significant digits
    assert d["bubble"] == pytest.approx(tl.bubble_rate, rel=1e-5)


def test_offload_lanes_and_curve_without_offload_in_the_data() -> None:
    import pipeoffload as po

    off = po.plan_offload(generate("group-interleaved", p=4, m=8), offload_chunks=1, offload_time=0.25)
    d = _page_data(timeline_html(off.timeline))["timelines"][0]
    bxs = boxes(off.timeline)
    assert d["lanes"] == ["compute", "d2h", "h2d"]
    assert sum(1 for k in d["ops"]["kind"] if d["kinds"][k] == "OFFLOAD") == sum(b.kind == "OFFLOAD" for b in bxs) > 0
    assert d["baseline"] is not None and d["baseline_peaks"] == [3, 2.5, 2, 1.5]
    assert d["peaks"] == off.peak


def _stash_timeline() -> Timeline:
    """ZB-H1 with both offload windows: chunk 0's activations (F→B) and the B→W stash."""
    import pipeoffload as po

    return po.plan_offload(generate("zb-h1", p=4, m=8), offload_chunks=1, offload_time=0.1, stash=True).timeline


def test_each_offload_window_merges_into_boxes_of_its_own_kind() -> None:
    """START/END pairs of both windows become one box each, on the lane of their direction, with
    their own colour, grid letter and name (the stash window's ops were drawn as sends before)."""
    from pipeoffload.viz import KIND_NAMES
    from pipeoffload.viz.text import render_grid

    tl = _stash_timeline()
    bxs = boxes(tl)
    for fam, lane in (("OFFLOAD", "d2h"), ("RELOAD", "h2d"), ("STASH_OFFLOAD", "d2h"), ("STASH_RELOAD", "h2d")):
        pairs = sum(1 for e in tl.events if e.op.kind.value == f"{fam}_START")
        mine = [b for b in bxs if b.kind == fam]
        assert len(mine) == pairs > 0 and {b.lane for b in mine} == {lane}, fam
        assert fam in KIND_COLORS and fam in KIND_NAMES
    assert not any(b.lane == "comm" for b in bxs)
    assert len(set(KIND_COLORS.values())) == len(KIND_COLORS)
    legend = render_grid(tl).splitlines()
    assert any("o=STASH_OFFLOAD, r=STASH_RELOAD" in line for line in legend) and "C=" not in "".join(legend)
    d = _page_data(timeline_html(tl))["timelines"][0]
    assert {"STASH_OFFLOAD", "STASH_RELOAD"} <= set(d["kinds"]) and d["lanes"] == ["compute", "d2h", "h2d"]


def test_png_draws_the_stash_window_and_makes_room_for_its_legend(tmp_path: Path) -> None:
    """(Shared with the PNG: the box kinds and colours.) Nine legend entries take a third row,
    which the figure grows for instead of drawing it over the time axis' label."""
    import matplotlib.image as mpimg
    import numpy as np
    import pipeoffload as po
    from pipeoffload.viz.png import draw_timeline

    sched = generate("zb-h1", p=4, m=8)
    plain = po.plan_offload(sched, offload_chunks=1, offload_time=0.1).timeline
    a = mpimg.imread(draw_timeline(plain, tmp_path / "a.png"))[..., :3]
    b = mpimg.imread(draw_timeline(_stash_timeline(), tmp_path / "b.png"))[..., :3]
    for fam in ("STASH_OFFLOAD", "STASH_RELOAD"):
        want = np.array([int(KIND_COLORS[fam][i:i + 2], 16) / 255 for i in (1, 3, 5)])
        assert (np.abs(b - want).max(axis=-1) < 2 / 255).sum() > 50, fam
        assert (np.abs(a - want).max(axis=-1) < 2 / 255).sum() == 0, fam
    assert a.shape[1] == b.shape[1] and b.shape[0] == a.shape[0] + 16  # one legend row more, 0.16 in


def test_script_in_a_name_cannot_end_the_data() -> None:
    tl = _tl("1f1b", p=2, m=2)
    tl.name = "</script><script>alert(1)</script><!--"
    page = timeline_html(tl)
    assert "<script>alert" not in page and "<!--" not in page
    assert _page_data(page)["timelines"][0]["name"] == tl.name


def test_op_errors_match_measured_with_predicted() -> None:
    meas, pred = _measured_pair(factor=1.5)
    errs = op_errors(meas, pred)
    mb, pb = boxes(meas), boxes(pred)
    assert len(errs) == len(pb) == sum(1 for b in mb if b.lane == "compute")  # the sends have no prediction
    for e in errs:
        a, b = mb[e.measured], pb[e.predicted]
        assert (a.rank, a.kind, a.stage, a.microbatch) == (b.rank, b.kind, b.stage, b.microbatch)
        assert e.duration_error == pytest.approx(0.5)
    d = _page_data(measured_html(meas, pred))
    dm, dp = d["timelines"]
    assert d["summary"]["matched"] == len(errs) and d["summary"]["error_median"] == pytest.approx(0.5)
    assert d["summary"]["unmatched"] == "measured only: 48 comm"  # a send after each forward of ranks 0-2
    assert dm["time"]["unit"] == "ms" and dm["memory_unit"] == "bytes" and dm["measured"]
    assert [x for x in dm["ops"]["error"] if x is not None] == [pytest.approx(0.5)] * len(errs)
    assert all(dp["ops"]["pair"][j] == i for i, j in enumerate(dm["ops"]["pair"]) if j >= 0)


def test_compare_page_has_every_schedule_with_numbers() -> None:
    cmp = compare(4, 3)  # interleaved-1f1b refuses m < p
    tls = comparison_timelines(cmp)
    d = _page_data(compare_html(cmp, tls))
    assert [r["label"] for r in d["rows"]] == [r.label for r in cmp.rows]
    assert {t["key"] for t in d["timelines"]} == {r.label for r in cmp.rows if r.ok} == set(tls)
    for t in d["timelines"]:
        assert len(t["ops"]["start"]) == len(boxes(tls[t["key"]]))
        row = next(r for r in cmp.rows if r.label == t["key"])
        assert max(t["peaks"]) == pytest.approx(row.peak_memory, rel=1e-5)
        assert t["bubble"] == pytest.approx(row.bubble_rate, rel=1e-5)
    refused = [r for r in d["rows"] if not r["ok"]]
    assert refused and all(r["error"] and not r["timeline"] for r in refused)


def test_html_module_imports_neither_torch_nor_matplotlib(tmp_path: Path) -> None:
    out = tmp_path / "t.html"
    assert_imports_no_torch(
        "pipeoffload.viz.html",
        then="from pipeoffload import generate, simulate\nfrom pipeoffload.viz.html import write_timeline_html\n"
             f"write_timeline_html(simulate(generate('1f1b', p=2, m=2)), {str(out)!r})",
        forbidden=("torch", "matplotlib"))
    assert out.stat().st_size > 10_000


def test_script_and_style_ship_as_package_data() -> None:
    """A wheel (not only an editable install) carries the files every page inlines."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib
    conf = tomllib.loads((Path(__file__).resolve().parent.parent / "pyproject.toml").read_text())
    assert set(conf["tool"]["setuptools"]["package-data"]["pipeoffload.viz"]) >= {"explorer.js", "explorer.css"}


# --- the command line --------------------------------------------------------------------------


def test_simulate_and_compare_write_html(tmp_path: Path, capsys) -> None:
    a, b = tmp_path / "new" / "sim.html", tmp_path / "cmp.html"
    assert main(["simulate", "zb-h1", "-p", "4", "-m", "8", "--html", str(a)]) == 0
    assert len(_page_data(a.read_text())["timelines"][0]["ops"]["start"]) == 96
    assert main(["compare", "-p", "4", "-m", "8", "--html", str(b)]) == 0
    assert f"wrote {b}" in capsys.readouterr().out
    assert _page_data(b.read_text())["kind"] == "compare"


@pytest.mark.parametrize("verb", ["simulate", "compare"])
@pytest.mark.parametrize("where", ["under_a_file", "a_directory", "proc"])
def test_an_html_path_that_cannot_be_written_is_one_line(verb: str, where: str, tmp_path: Path, capsys) -> None:
    a_file = tmp_path / "f.txt"
    a_file.write_text("x")
    out = {"under_a_file": str(a_file / "sub" / "x.html"), "a_directory": str(tmp_path), "proc": "/proc/x/y.html"}[where]
    argv = (["simulate", "1f1b"] if verb == "simulate" else ["compare"]) + ["-p", "4", "-m", "8", "--html", out]
    assert main(argv) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith(f"pipeoffload {verb}: error: --html: cannot write {out}"), err


def test_a_late_html_write_failure_is_one_line(tmp_path: Path, capsys, monkeypatch) -> None:
    def full(self, *a, **k):
        raise OSError(28, "No space left on device", str(self))

    monkeypatch.setattr(Path, "write_text", full)
    out = tmp_path / "t.html"
    assert main(["simulate", "1f1b", "-p", "2", "-m", "2", "--html", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"pipeoffload simulate: error: --html: cannot write {out}: No space left on device"


# --- a real browser ------------------------------------------------------------------------------


def _chromium() -> str | None:
    for name in (os.environ.get("PIPEOFFLOAD_CHROMIUM"), "chromium", "chromium-browser", "google-chrome"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


#: argv[1], argv[2]: fds to move to 3 and 4 (via fds >= 10, so neither overwrites the other); argv[3:]: the command.
_ON_FDS_3_4 = """import fcntl, os, sys
a, b = (fcntl.fcntl(int(fd), fcntl.F_DUPFD, 10) for fd in sys.argv[1:3])
os.dup2(a, 3)
os.dup2(b, 4)
os.closerange(5, 1024)
os.execv(sys.argv[3], sys.argv[3:])
"""


class Chromium:
    """Headless Chromium driven over the DevTools protocol on a pipe (fds 3 and 4).

    ``call``/``send`` (the page's session) return a command's result; events (console
    messages, exceptions, requests, load) are kept in ``events``."""

    def __init__(self, exe: str, width: int = 1400, height: int = 900) -> None:
        self.profile = tempfile.mkdtemp(prefix="pipeoffload-chromium-")
        to_chrome, self._to_w = os.pipe()
        self._from_r, from_chrome = os.pipe()
        args = [exe, "--headless", "--no-sandbox", "--disable-gpu", "--remote-debugging-pipe",
                f"--user-data-dir={self.profile}", "--no-first-run", "--no-default-browser-check",
                "--disable-extensions", "--disable-background-networking", "--disable-component-update",
                "--disable-sync", "--host-resolver-rules=MAP * ~NOTFOUND", f"--window-size={width},{height}",
                "--force-device-scale-factor=1", "--hide-scrollbars", "--mute-audio", "about:blank"]
        # A small Python trampoline puts the pipe ends on fds 3 and 4, where
        # --remote-debugging-pipe looks, then becomes Chromium.
        self.proc = subprocess.Popen([sys.executable, "-c", _ON_FDS_3_4, str(to_chrome), str(from_chrome), *args],
                                     pass_fds=(to_chrome, from_chrome), stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        os.close(to_chrome)
        os.close(from_chrome)
        self._next = 0
        self._results: dict[int, dict] = {}
        self._closed = False
        self._cv = threading.Condition()
        self.events: list[dict] = []
        threading.Thread(target=self._read, daemon=True).start()
        try:
            page = next(t for t in self.call("Target.getTargets")["targetInfos"] if t["type"] == "page")
        except Exception:
            err = self.close()
            raise RuntimeError(f"Chromium ({exe}) did not answer on its DevTools pipe: {err[-2000:]}") from None
        self.session = self.call("Target.attachToTarget", targetId=page["targetId"], flatten=True)["sessionId"]
        for domain in ("Runtime", "Log", "Page", "Network"):
            self.send(f"{domain}.enable")

    def _read(self) -> None:
        buf = b""
        while chunk := os.read(self._from_r, 1 << 16):
            buf += chunk
            *messages, buf = buf.split(b"\0")
            with self._cv:
                for raw in messages:
                    msg = json.loads(raw)
                    if "id" in msg:
                        self._results[msg["id"]] = msg
                    else:
                        self.events.append(msg)
                self._cv.notify_all()
        with self._cv:
            self._closed = True
            self._cv.notify_all()

    def call(self, method: str, session: str | None = None, timeout: float = 30, **params) -> dict:
        self._next += 1
        n = self._next
        msg = {"id": n, "method": method, "params": params, **({"sessionId": session} if session else {})}
        os.write(self._to_w, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + timeout
        with self._cv:
            while n not in self._results:
                left = deadline - time.monotonic()
                if left <= 0 or self._closed:
                    raise TimeoutError(f"Chromium: no answer to {method}")
                self._cv.wait(left)
            reply = self._results.pop(n)
        if "error" in reply:
            raise RuntimeError(f"Chromium: {method}: {reply['error']}")
        return reply.get("result", {})

    def send(self, method: str, **params) -> dict:
        return self.call(method, session=self.session, **params)

    def open(self, path: Path, width: int = 1400, height: int = 900) -> None:
        """Load ``path`` at the given viewport; wait for the load event and the explorer."""
        self.send("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1, mobile=False)
        with self._cv:
            self.events.clear()
        self.send("Page.navigate", url=Path(path).resolve().as_uri())
        deadline = time.monotonic() + 30
        with self._cv:
            while not any(e.get("method") == "Page.loadEventFired" for e in self.events):
                assert time.monotonic() < deadline, "the page did not load in 30 s"
                self._cv.wait(0.5)
        assert self.eval("!!(window.poExplorer && poExplorer.ready)"), self.errors()

    def eval(self, expr: str):
        r = self.send("Runtime.evaluate", expression=expr, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in r:
            raise AssertionError(f"{expr}: {json.dumps(r['exceptionDetails'])[:1500]}")
        return r["result"].get("value")

    def mouse(self, kind: str, x: float, y: float, **kw) -> None:
        self.send("Input.dispatchMouseEvent", type=kind, x=x, y=y, **kw)

    def click(self, x: float, y: float) -> None:
        self.mouse("mouseMoved", x, y)
        self.mouse("mousePressed", x, y, button="left", buttons=1, clickCount=1)
        self.mouse("mouseReleased", x, y, button="left", buttons=0, clickCount=1)

    def key(self, key: str) -> None:
        self.send("Input.dispatchKeyEvent", type="keyDown", key=key, text=key)
        self.send("Input.dispatchKeyEvent", type="keyUp", key=key)

    def center(self, selector: str) -> tuple[float, float]:
        r = self.eval(f"(() => {{ const r = document.querySelector({json.dumps(selector)}).getBoundingClientRect();"
                      " return [r.left + r.width / 2, r.top + r.height / 2]; })()")
        return r[0], r[1]

    def frame(self) -> None:
        self.eval("poExplorer.frame()")

    def errors(self, levels: tuple[str, ...] = ("error",)) -> list[str]:
        """Console messages and log entries at ``levels`` (a blocked load is an error) and
        uncaught exceptions, since the page was opened."""
        out = []
        with self._cv:
            events = list(self.events)
        for e in events:
            m, p = e.get("method"), e.get("params", {})
            if m == "Runtime.consoleAPICalled" and p.get("type") in levels + ("assert",):
                out.append(" ".join(str(a.get("value", a.get("description"))) for a in p.get("args", [])))
            elif m == "Runtime.exceptionThrown":
                out.append(json.dumps(p["exceptionDetails"])[:800])
            elif m == "Log.entryAdded" and p["entry"]["level"] in levels:
                out.append(p["entry"]["text"])
        return out

    def requests(self) -> list[str]:
        with self._cv:
            return [e["params"]["request"]["url"] for e in self.events if e.get("method") == "Network.requestWillBeSent"]

    def screenshot(self, path: Path, width: int = 1400) -> tuple[int, int]:
        """The whole page as a PNG at ``path``; returns its size."""
        self.send("Emulation.setDeviceMetricsOverride", width=width, height=600, deviceScaleFactor=1, mobile=False)
        height = int(self.eval("Math.ceil(document.getElementById('po-app').getBoundingClientRect().bottom) + 4"))
        self.send("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1, mobile=False)
        self.eval("new Promise(r => setTimeout(r, 150))")  # the explorer relayouts after a resize
        self.frame()
        data = base64.b64decode(self.send("Page.captureScreenshot", format="png")["data"])
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_bytes(data)
        return struct.unpack(">II", data[16:24])

    def close(self) -> str:
        """Stop Chromium (the process this object started); returns its stderr."""
        try:
            if not self._closed:
                self.call("Browser.close", timeout=5)
        except (TimeoutError, RuntimeError, OSError):
            pass
        try:
            _, err = self.proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            _, err = self.proc.communicate()
        for fd in (self._to_w, self._from_r):
            try:
                os.close(fd)
            except OSError:
                pass
        shutil.rmtree(self.profile, ignore_errors=True)
        return (err or b"").decode(errors="replace")


@pytest.fixture(scope="module")
def browser():
    exe = _chromium()
    if exe is None:  # CI must run them: a failure, not a skip (PIPEOFFLOAD_ALLOW_MISSING=1 skips)
        msg = ("no Chromium found (chromium, chromium-browser, google-chrome or $PIPEOFFLOAD_CHROMIUM): "
               "the browser tests need it; `make test` installs it (apt-get install chromium). "
               "PIPEOFFLOAD_ALLOW_MISSING=1 skips them instead")
        if os.environ.get("PIPEOFFLOAD_ALLOW_MISSING") == "1":
            pytest.skip(msg)
        pytest.fail(msg, pytrace=False)
    b = Chromium(exe)
    yield b
    b.close()


def _open_clean(browser: Chromium, path: Path, **kw) -> None:
    """Load ``path``; no console error or warning, no request but the file itself. (Later
    checks look at errors only: the tests' own pixel readbacks make Chromium warn.)"""
    browser.open(path, **kw)
    browser.frame()
    assert browser.errors(("error", "warning")) == []
    assert browser.requests() == [path.resolve().as_uri()]


def _colour_of(browser: Chromium, panel: int, op: int) -> str:
    """The drawn colour inside op ``op``, off its label: 2 px in from its top left corner."""
    c = browser.eval(f"poExplorer.opCenter({panel}, {op})")
    rgb = browser.eval(f"poExplorer.pixel({panel}, {c['left'] + 2}, {c['top'] + 2})")
    return "#" + "".join(f"{x:02x}" for x in rgb[:3])


def _hover(browser: Chromium, panel: int, op: int) -> str:
    """Move the mouse onto op ``op`` of panel ``panel``; the tooltip's text (asserted shown)."""
    c = browser.eval(f"poExplorer.opCenter({panel}, {op})")
    assert c, "the op is not in view"
    if not 10 < c["y"] < browser.eval("innerHeight") - 10:  # scroll it into the viewport first
        browser.eval(f"window.scrollBy(0, {c['y']} - innerHeight / 2)")
        c = browser.eval(f"poExplorer.opCenter({panel}, {op})")
    browser.mouse("mouseMoved", c["x"], c["y"])
    assert browser.eval("getComputedStyle(document.getElementById('po-tooltip')).display") == "block"
    return browser.eval("document.getElementById('po-tooltip').innerText")


def test_browser_timeline_page_draws_hovers_zooms_pans_and_hides_ranks(browser, tmp_path: Path) -> None:
    tl = _tl("zb-h1")  # ZB-H1, p=4, m=8: F, B and W of 8 microbatches on each of 4 stages
    page = write_timeline_html(tl, tmp_path / "zb.html")
    _open_clean(browser, page)
    n = 3 * 4 * 8
    assert browser.eval("poExplorer.panels()")[0]["drawn"] == n == len(boxes(tl))
    assert browser.eval("document.querySelector('canvas.po-base').dataset.drawn") == str(n)

    # The first forward of rank 0 is drawn in the PNG's colour for F, at its centre.
    i = browser.eval("poExplorer.findOp(0, {kind: 'F', rank: 0, mb: 0})")
    assert _colour_of(browser, 0, i) == KIND_COLORS["F"]
    assert _colour_of(browser, 0, browser.eval("poExplorer.findOp(0, {kind: 'W', rank: 3})")) == KIND_COLORS["W"]

    # Hover: every field of the op, with the values the timeline holds.
    j = browser.eval("poExplorer.findOp(0, {kind: 'W', rank: 2, mb: 5})")
    op = browser.eval(f"poExplorer.op(0, {j})")
    ev = next(e for e in tl.events if e.op.kind is OpKind.W and e.rank == 2 and e.op.microbatch == 5)
    assert (op["start"], op["end"]) == (pytest.approx(ev.start), pytest.approx(ev.end))
    text = _hover(browser, 0, j)
    for part in ("kind W", "microbatch 5", "rank 2", f"stage {ev.op.stage}", "chunk 0", f"start {op['start']:g}",
                 f"end {op['end']:g}", f"memory after {op['after']:g}"):
        assert part in text, (part, text)
    browser.mouse("mouseMoved", 5, 5)
    assert browser.eval("getComputedStyle(document.getElementById('po-tooltip')).display") == "none"

    # Zoom with ctrl + wheel around an op: the view narrows around it, fewer ops are drawn.
    full = browser.eval("poExplorer.view()")
    c = browser.eval(f"poExplorer.opCenter(0, {j})")
    t_before = op["start"] + (op["end"] - op["start"]) / 2
    browser.mouse("mouseWheel", c["x"], c["y"], deltaX=0, deltaY=-500, modifiers=2)
    browser.frame()
    view = browser.eval("poExplorer.view()")
    assert view[1] - view[0] < 0.5 * (full[1] - full[0])
    assert view[0] < t_before < view[1]
    drawn = browser.eval("poExplorer.panels()")[0]["drawn"]
    assert 0 < drawn < n
    c2 = browser.eval(f"poExplorer.opCenter(0, {j})")
    assert abs(c2["x"] - c["x"]) < 3  # the point under the mouse stays put
    assert "kind W" in _hover(browser, 0, j)

    # Pan by dragging: the view moves by the dragged distance, its width stays.
    x0, y0 = c2["x"], c2["y"]
    browser.mouse("mousePressed", x0, y0, button="left", buttons=1, clickCount=1)
    browser.mouse("mouseMoved", x0 - 150, y0, button="left", buttons=1)
    browser.mouse("mouseReleased", x0 - 150, y0, button="left", buttons=0, clickCount=1)
    browser.frame()
    panned = browser.eval("poExplorer.view()")
    assert panned[1] - panned[0] == pytest.approx(view[1] - view[0])
    assert panned[0] > view[0]

    # The reset button shows everything again; the + button and the "-" key zoom.
    browser.click(*browser.center("button[data-action=reset]"))
    browser.frame()
    assert browser.eval("poExplorer.panels()")[0]["drawn"] == n
    browser.click(*browser.center("button[data-action=zoom-in]"))
    browser.frame()
    zoomed = browser.eval("poExplorer.view()")
    assert zoomed[1] - zoomed[0] == pytest.approx((full[1] - full[0]) / 2)
    browser.key("-")
    browser.frame()
    assert browser.eval("poExplorer.view()")[1] - browser.eval("poExplorer.view()")[0] == pytest.approx(full[1] - full[0])

    # Drag across the ruler: the view becomes that range.
    canvas = browser.eval("(() => { const r = document.querySelector('canvas.po-overlay').getBoundingClientRect();"
                          " return [r.left, r.top]; })()")
    xa, xb = browser.eval(f"poExplorer.opCenter(0, {i})")["x"], browser.eval(f"poExplorer.opCenter(0, {j})")["x"]
    browser.mouse("mousePressed", xa, canvas[1] + 10, button="left", buttons=1, clickCount=1)
    browser.mouse("mouseMoved", xb, canvas[1] + 10, button="left", buttons=1)
    browser.mouse("mouseReleased", xb, canvas[1] + 10, button="left", buttons=0, clickCount=1)
    browser.frame()
    brushed = browser.eval("poExplorer.view()")
    assert brushed[0] == pytest.approx(0.5, abs=0.2) and brushed[1] == pytest.approx(t_before, abs=0.2)

    # Hide rank 2 with its checkbox: its 24 ops are no longer drawn and the canvas is shorter.
    browser.click(*browser.center("button[data-action=reset]"))
    browser.frame()
    height = browser.eval("poExplorer.panels()")[0]["height"]
    browser.click(*browser.center("input[data-rank='2']"))
    browser.frame()
    assert browser.eval("poExplorer.hidden()") == [2]
    got = browser.eval("poExplorer.panels()")[0]
    assert got["drawn"] == n - 3 * 8 and got["height"] < height
    browser.click(*browser.center("input[data-rank='2']"))
    browser.frame()
    assert browser.eval("poExplorer.panels()")[0]["drawn"] == n
    assert browser.errors() == []


def test_browser_offload_lanes(browser, tmp_path: Path) -> None:
    import pipeoffload as po

    off = po.plan_offload(generate("group-interleaved", p=4, m=8), offload_chunks=1, offload_time=0.25)
    _open_clean(browser, write_timeline_html(off.timeline, tmp_path / "off.html"))
    assert browser.eval("poExplorer.panels()")[0]["drawn"] == len(boxes(off.timeline))
    k = browser.eval("poExplorer.findOp(0, {kind: 'OFFLOAD', rank: 0})")
    assert _colour_of(browser, 0, k) == KIND_COLORS["OFFLOAD"]
    assert "kind OFFLOAD" in _hover(browser, 0, k)
    # Both windows: the stash transfers in their own colours (zoomed in: they are 0.1 units long).
    tl = _stash_timeline()
    _open_clean(browser, write_timeline_html(tl, tmp_path / "stash.html"))
    assert browser.eval("poExplorer.panels()")[0]["drawn"] == len(boxes(tl))
    for fam in ("STASH_OFFLOAD", "STASH_RELOAD"):
        k = browser.eval(f"poExplorer.findOp(0, {{kind: '{fam}', rank: 1}})")
        op = browser.eval(f"poExplorer.op(0, {k})")
        browser.eval(f"poExplorer.setView({op['start']} - 0.5, {op['end']} + 0.5)")
        browser.frame()
        assert _colour_of(browser, 0, k) == KIND_COLORS[fam]
        assert f"kind {fam}" in _hover(browser, 0, k)


def test_browser_empty_timeline_and_every_rank_hidden(browser, tmp_path: Path) -> None:
    _open_clean(browser, write_timeline_html(Timeline(2, [], "empty"), tmp_path / "empty.html"))
    assert browser.eval("poExplorer.panels()")[0]["drawn"] == 0
    _open_clean(browser, write_timeline_html(_tl("1f1b", p=2, m=2), tmp_path / "small.html"))
    browser.click(*browser.center("button[data-action=ranks-none]"))
    browser.frame()
    assert browser.eval("poExplorer.hidden()") == [0, 1] and browser.eval("poExplorer.panels()")[0]["drawn"] == 0
    browser.click(*browser.center("button[data-action=ranks-all]"))
    browser.frame()
    assert browser.eval("poExplorer.panels()")[0]["drawn"] == 8
    assert browser.errors() == []


def test_browser_compare_page_selector_and_pareto_links(browser, tmp_path: Path) -> None:
    cmp = compare(4, 8)
    tls = comparison_timelines(cmp)
    path = tmp_path / "cmp.html"
    path.write_text(compare_html(cmp, tls))
    _open_clean(browser, path)
    first = browser.eval("poExplorer.panels()")
    assert len(first) == 1 and first[0]["key"] in {r.label for r in cmp.rows if r.on_frontier}
    assert first[0]["drawn"] == len(boxes(tls[first[0]["key"]]))
    assert browser.eval("document.querySelectorAll('a.po-point').length") == len({(r.peak_memory, r.bubble_rate)
                                                                                  for r in cmp.rows if r.ok})
    # A point of the Pareto plot links to its schedule's timeline.
    browser.click(*browser.center("a.po-point[data-label='1f1b'] circle"))
    browser.frame()
    got = browser.eval("poExplorer.panels()")
    assert [p["key"] for p in got] == ["1f1b"] and got[0]["drawn"] == 2 * 4 * 8
    assert browser.eval("location.hash") == "#schedule=1f1b"
    # The selectors: another schedule, and a second one below on the same axes.
    browser.eval("(() => { const s = document.getElementById('po-select'); s.value = 'zb-h1';"
                 " s.dispatchEvent(new Event('change')); })()")
    browser.eval("new Promise(r => setTimeout(r, 50))")
    browser.eval("(() => { const s = document.getElementById('po-select-b'); s.value = 'v-min';"
                 " s.dispatchEvent(new Event('change')); })()")
    browser.eval("new Promise(r => setTimeout(r, 50))")
    browser.frame()
    got = browser.eval("poExplorer.panels()")
    assert [p["key"] for p in got] == ["zb-h1", "v-min"]
    assert [p["drawn"] for p in got] == [len(boxes(tls["zb-h1"])), len(boxes(tls["v-min"]))]
    assert "kind F" in _hover(browser, 1, browser.eval("poExplorer.findOp(1, {kind: 'F', rank: 3})"))
    assert browser.errors() == []


def test_browser_measured_page_shows_both_timelines_and_the_error(browser, tmp_path: Path) -> None:
    meas, pred = _measured_pair(factor=1.5)
    _open_clean(browser, write_measured_html(meas, pred, tmp_path / "run" / "timeline.html"))
    got = browser.eval("poExplorer.panels()")
    assert [p["key"] for p in got] == ["measured", "predicted"]
    assert [p["drawn"] for p in got] == [len(boxes(meas)), len(boxes(pred))]
    i = browser.eval("poExplorer.findOp(0, {kind: 'B', rank: 1, mb: 2})")
    text = _hover(browser, 0, i)
    assert "kind B" in text and "predicted" in text and "duration +50.0%" in text, text
    j = browser.eval("poExplorer.findOp(1, {kind: 'B', rank: 1, mb: 2})")
    assert "measured" in _hover(browser, 1, j)
    s = browser.eval("poExplorer.findOp(0, {kind: 'SEND_F', rank: 0})")
    assert "peer 1" in _hover(browser, 0, s)
    assert browser.errors() == []


def test_browser_draws_p16_m64_v2_smoothly(browser, tmp_path: Path, record_property) -> None:
    """interleaved 1F1B at p=16, m=64, v=2: 4096 ops; a full redraw (flushed to pixels) well under a frame budget
    of 60 ms even on a loaded 2-core CI machine (5-20 ms measured there)."""
    tl = _tl("interleaved-1f1b", p=16, m=64, v=2)
    path = write_timeline_html(tl, tmp_path / "big.html")
    _open_clean(browser, path)
    assert browser.eval("poExplorer.panels()")[0]["drawn"] == 16 * 64 * 2 * 2
    times = browser.eval("poExplorer.benchmark(30)")
    stats = browser.eval("poExplorer.stats")
    med = statistics.median(times)
    record_property("page_bytes", path.stat().st_size)
    record_property("redraw_ms_median", med)
    record_property("load_ms", stats["loadMs"])
    print(f"\np=16 m=64 v=2: {path.stat().st_size} bytes, load {stats['loadMs']:.0f} ms, first draw "
          f"{stats['firstDrawMs']:.0f} ms, redraw median {med:.1f} ms, max {max(times):.1f} ms")
    assert med < 60, times
    assert browser.errors() == []


@pytest.mark.parametrize("kind", ["timeline", "compare", "measured"])
def test_browser_screenshot_of_each_page_kind(browser, tmp_path: Path, kind: str, capsys) -> None:
    """A screenshot of each page kind, written by the command line, is a real picture of the page.
    With ``PIPEOFFLOAD_DOCS_SCREENSHOTS=1`` the timeline and compare pictures are docs/'s (the
    measured one in docs/ comes from a real `pipeoffload train` run, docs/explorer.md)."""
    docs = os.environ.get("PIPEOFFLOAD_DOCS_SCREENSHOTS") == "1" and kind != "measured"
    path = tmp_path / f"{kind}.html"
    if kind == "timeline":
        assert main(["simulate", "group-interleaved", "-p", "8", "-m", "16", "--offload-chunks", "1",
                     "--offload-time", "0.25", "--html", str(path)]) == 0
    elif kind == "compare":
        assert main(["compare", *(["-p", "8", "-m", "32"] if docs else ["-p", "4", "-m", "8"]), "--html", str(path)]) == 0
    else:
        write_measured_html(*_measured_pair(), path)
    capsys.readouterr()
    _open_clean(browser, path)
    if kind != "compare":  # hover an op so the picture shows a tooltip
        i = browser.eval("poExplorer.findOp(0, {kind: 'B', rank: 1, mb: 4, chunk: 1})")
        assert "microbatch 4" in _hover(browser, 0, i)
    out = (DOCS if docs else tmp_path) / f"explorer-{kind}.png"
    w, h = browser.screenshot(out)
    assert w == 1400 and h > 400
    assert out.stat().st_size > 40_000
    assert browser.errors() == []


def test_compare_page_draws_the_timelines_the_study_timed(monkeypatch) -> None:
    """The comparison page never generates, lowers or times a schedule again: it draws
    each row's own timeline (the offload pass's for PipeOffload's rows)."""
    import importlib

    lower_mod = importlib.import_module("pipeoffload.passes.lower")  # the module (the package exports the function)
    timing_mod = importlib.import_module("pipeoffload.passes.timing")

    cmp = compare(4, 8)
    assert all((r.timeline is not None) == r.ok for r in cmp.rows)

    def refuse(*a, **k):
        raise AssertionError("the page re-timed a schedule")

    monkeypatch.setattr(timing_mod, "simulate", refuse)
    monkeypatch.setattr(lower_mod, "lower", refuse)
    tls = comparison_timelines(cmp)
    assert all(tls[r.label] is r.timeline for r in cmp.rows if r.ok)
    po = next(r for r in cmp.rows if r.label == "PO-half")
    assert max(po.timeline.peak_memory()) == pytest.approx(po.peak_memory)
    assert comparison_timelines(cmp, "bytes")[po.label].memory_unit == "bytes"
    assert _page_data(compare_html(cmp, tls))["timelines"]
