"""CueGUI and CueSubmit, OpenCue's own GUI clients, against `cuectl serve --opencue` (issue 34).

Run by scripts/cuegui-check.sh in .venv-cuegui under xvfb-run (it installs what this needs).
In a temporary directory: a store, a GPU job (three frames of one GPU each, one running at a
time, each writing a log line a second), a real `cuectl worker` on fake GPUs
(examples/fake-gpus.yaml: two devices) and a real `cuectl serve --opencue 127.0.0.1:0`. Then,
each as its own program, as a user runs them:

- Cuetopia (CueGUI's main window with its default layout): the job typed into "Load:" shows
  in Monitor Jobs; double-clicking it lists its layer and frames in Monitor Job Details (the
  running frame RUNNING on the fake host with its GPU); clicking that frame shows its log in
  LogView (opened from Views/Plugins), the text the frame wrote, read from
  <Job.log_dir>/<job>.<frame>.rqlog.
- CueCommander: Monitor Cue (with $SHOW set) lists the job under its show; Monitor Hosts
  (opened from Views/Plugins) shows the fake host with its GPUs and idle GPUs equal to the
  devices minus those the running frames hold; double-clicking it lists the running frame's
  proc.
- CueSubmit: its submission function (cuesubmit.Submission.submitJob) with the job data its
  window builds (a Shell layer); the job is then in the store (`cuectl job show --json`)
  and its frames run on the worker and succeed.

Every gRPC call the GUI programs make is recorded (method and status); one answered
UNIMPLEMENTED or INTERNAL fails the check, naming it. Screenshots (QWidget.grab) go to
docs/images/cuegui-{cuetopia,frames,hosts}.png, or to --screenshots DIR. Exits 1 with a
"FAILED:" line for each failed check.
"""

from __future__ import annotations

import argparse
import getpass
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parents[1]
FAKE_GPUS = REPO / "examples" / "fake-gpus.yaml"
SHOW = "testing"
# Status codes that mean the server, not the client, could not answer a view.
BAD_CODES = {"UNIMPLEMENTED", "INTERNAL", "UNKNOWN", "INVALID_ARGUMENT", "UNAUTHENTICATED", "PERMISSION_DENIED"}
SCREENSHOT_LIMIT = 200 * 1024
SERVING = re.compile(r"serving OpenCue's gRPC protocol on \S+ \(port (\d+)\)")

# The GPU frame: a log line a second until killed (the check kills the job when done).
FRAME = r"""
import os, sys, time
for i in range(900):
    print(f"cuegui-check frame {sys.argv[1]} line {i} on GPU {os.environ.get('CUDA_VISIBLE_DEVICES')}", flush=True)
    time.sleep(1)
"""


class Failed(Exception):
    pass


def say(message: str) -> None:
    print(f"cuegui-check: {message}", flush=True)


# -- the orchestrator: store, worker, server, then each GUI program as its own process ------


class Farm:
    """A store, a worker on fake GPUs and `cuectl serve --opencue`, in ``tmp``."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.db = tmp / "store" / "cuectl.db"
        self.db.parent.mkdir()
        self.procs: list[tuple[str, subprocess.Popen[bytes]]] = []
        self.cuectl = [str(Path(sys.executable).with_name("cuectl")), "--db", str(self.db)]
        self.port = 0
        self.server_log: list[str] = []

    def run(self, *args: str, timeout: float = 60) -> str:
        res = subprocess.run([*self.cuectl, *args], capture_output=True, text=True, timeout=timeout, cwd=self.tmp)
        if res.returncode != 0:
            raise Failed(f"cuectl {' '.join(args)} exited {res.returncode}: {res.stderr.strip()}")
        return res.stdout

    def rqlog(self, job_id: str, job: str, frame: str) -> Path:
        """Where CueGUI opens the frame's log: run/logs.py's one definition of the layout."""
        from cuectl.run.logs import job_log_dir, rqlog_path
        from cuectl.sched.store import open_store

        store = open_store(str(self.db), create=False)
        try:
            path = rqlog_path(job_log_dir(store.log_dir, int(job_id)), job, frame)
        finally:
            store.close()
        if path is None:
            raise Failed(f"job name {job!r} cannot name an rqlog file")
        return path

    def json(self, *args: str) -> Any:
        return json.loads(self.run(*args, "--json"))

    def start_worker(self) -> None:
        log = open(self.tmp / "worker.log", "wb")
        # --cores 4: room for CueSubmit's frames beside the GPU frame on a machine of any size.
        proc = subprocess.Popen(
            [*self.cuectl, "worker", "--poll", "0.2", "--sample-interval", "1", "--cores", "4"],
            env={**os.environ, "CUECTL_FAKE_GPUS": str(FAKE_GPUS), "CUECTL_KILL_GRACE": "1"},
            cwd=self.tmp,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.procs.append(("worker", proc))

    def start_server(self) -> None:
        proc = subprocess.Popen(
            [*self.cuectl, "serve", "--opencue", "127.0.0.1:0"],
            cwd=self.tmp,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.procs.append(("server", proc))
        assert proc.stdout is not None
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            line = proc.stdout.readline().decode(errors="replace")
            if not line:
                break
            self.server_log.append(line)
            found = SERVING.search(line)
            if found:
                self.port = int(found.group(1))
                break
        if not self.port:
            raise Failed("cuectl serve --opencue did not start:\n" + "".join(self.server_log))

        def drain() -> None:
            for raw in proc.stdout:  # type: ignore[union-attr]
                self.server_log.append(raw.decode(errors="replace"))

        threading.Thread(target=drain, daemon=True).start()

    def stop(self) -> None:
        for name, proc in reversed(self.procs):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(15)
                except subprocess.TimeoutExpired:
                    say(f"{name} did not stop on SIGTERM in 15 s: killed")
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()

    def check_alive(self) -> None:
        for name, proc in self.procs:
            if proc.poll() is not None:
                raise Failed(f"the {name} exited ({proc.returncode}) during the check; its log is in {self.tmp}")


def wait(
    what: str,
    probe: Callable[[], Any],
    timeout: float,
    *,
    tick: Callable[[], None] | None = None,
    seen: Callable[[], str] | None = None,
) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise Failed(f"{what}: not after {timeout:.0f} s" + (f" ({seen()})" if seen else ""))
        if tick:
            tick()
        time.sleep(0.1)


def orchestrate(args: argparse.Namespace) -> int:
    shots = Path(args.screenshots).resolve()
    shots.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="cuegui-check-"))
    # Nothing of the user's: the store, device locks and CueGUI's/CueSubmit's settings
    # (QSettings under XDG_CONFIG_HOME) all in tmp; pycue reads only the config named here.
    os.environ.update(
        {
            "XDG_STATE_HOME": str(tmp / "xdg-state"),
            "XDG_CONFIG_HOME": str(tmp / "config"),
            "CUECTL_LOCK_DIR": str(tmp / "locks"),
            "CUECTL_CREATE_LOCK_DIR": "1",
            "CUECTL_LOCK_REGISTRY": str(tmp / "lock-registry"),
            "CUECTL_RUN_CACHE": str(tmp / "run.cache"),
            "OPENCUE_CONFIG_FILE": str(tmp / "opencue.yaml"),
            "NO_COLOR": "1",
            "GRPC_VERBOSITY": "ERROR",
        }
    )
    for name in ("CUECTL_DB", "CUECTL_LOG_DIR", "CUECTL_FAKE_GPUS", "CUEBOT_FACILITY", "SHOW", "SHOT"):
        os.environ.pop(name, None)
    (tmp / "opencue.yaml").write_text("cuebot.timeout: 10000\n")
    farm = Farm(tmp)
    failures: list[str] = []
    started = time.monotonic()
    try:
        user = getpass.getuser()
        job = f"{SHOW}-sh010-{user}_gpu-render"
        spec = {
            "name": job,
            "show": SHOW,
            "shot": "sh010",
            "layers": [
                {
                    "name": "render",
                    "command": [sys.executable, "-u", "-c", FRAME, "#IFRAME#"],
                    "range": "1-3",
                    "gpus": 1,
                    "cores": 1,
                    "max_running": 1,
                }
            ],
        }
        (tmp / "job.json").write_text(json.dumps(spec))
        job_id = farm.run("submit", str(tmp / "job.json")).strip()
        farm.start_worker()
        farm.start_server()
        os.environ["CUEBOT_HOSTS"] = f"127.0.0.1:{farm.port}"
        say(f"job {job_id} {job}; worker on {FAKE_GPUS.name}; server on 127.0.0.1:{farm.port}; in {tmp}")

        def running() -> list[dict[str, Any]]:
            farm.check_alive()
            return [f for f in farm.json("frame", "list", "--job", job_id)["frames"] if f["state"] == "RUNNING"]

        frames = wait("a frame of the GPU job RUNNING on the worker", running, 60)
        host = frames[0]["host"]
        rqlog = farm.rqlog(job_id, job, frames[0]["name"])
        wait(
            f"three log lines in {rqlog}",
            lambda: rqlog.exists() and rqlog.read_text(errors="replace").count("\n") >= 3,
            30,
        )
        hosts = {h["name"]: h for h in farm.json("host", "list")["hosts"]}
        total = len(hosts[host]["gpus"])
        held = sum(len(f["gpu_uuids"]) for f in running() if f["host"] == host)
        context = {
            "job": job,
            "job_id": job_id,
            "host": host,
            "gpus": total,
            "idle_gpus": total - held,
            "frame": frames[0]["name"],
            "frame_number": frames[0]["number"],
            "rqlog": str(rqlog),
            "screenshots": str(shots),
            "user": user,
        }
        (tmp / "context.json").write_text(json.dumps(context))
        say(f"{host}: {total} GPUs, {held} held by running frames: CueCommander must show {total - held} idle")

        for app in ("cuetopia", "cuecommander"):
            failures += run_gui(app, tmp, farm)
        failures += check_cuesubmit(tmp, farm)
        if running() == [] and not failures:
            failures.append("the GPU job's frame stopped running during the check")
        farm.run("job", "kill", job_id)
    except Failed as exc:
        failures.append(str(exc))
    finally:
        farm.stop()
        (tmp / "server.log").write_text("".join(farm.server_log))
        errors = [line.rstrip() for line in farm.server_log if " ERROR " in line or " WARNING " in line]
        if errors:
            say("the server logged:\n    " + "\n    ".join(errors))
        if failures or args.keep:
            say(f"logs kept in {tmp} (server.log, worker.log, cuetopia.log, cuecommander.log, cuesubmit.log)")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    for failure in failures:
        print(f"cuegui-check: FAILED: {failure}", file=sys.stderr, flush=True)
    say(f"{'FAILED' if failures else 'passed'} in {time.monotonic() - started:.1f} s")
    return 1 if failures else 0


def run_gui(app: str, tmp: Path, farm: Farm, timeout: float = 180) -> list[str]:
    """One GUI program (this file with --app) as its own process; its failures."""
    log = tmp / f"{app}.log"
    result = tmp / f"{app}.json"
    env = dict(os.environ)
    if app == "cuecommander":
        env["SHOW"] = SHOW  # Monitor Cue monitors $SHOW at start, as for an artist in a show's shell
    with open(log, "wb") as out:
        try:
            proc = subprocess.run(
                [
                    sys.executable,
                    __file__,
                    "--app",
                    app,
                    "--context",
                    str(tmp / "context.json"),
                    "--result",
                    str(result),
                ],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                timeout=timeout,
                cwd=tmp,
            )
        except subprocess.TimeoutExpired:
            return [f"{app}: did not finish in {timeout:.0f} s (log: {log})"]
    if not result.exists():
        tail = log.read_text(errors="replace").splitlines()[-15:]
        return [f"{app}: exited {proc.returncode} without a result:\n    " + "\n    ".join(tail)]
    outcome = json.loads(result.read_text())
    for line in outcome["passed"]:
        say(f"{app}: ok: {line}")
    calls = outcome["calls"]
    say(f"{app}: {sum(calls.values())} gRPC calls, " + ", ".join(f"{k} x{v}" for k, v in sorted(calls.items())))
    return [f"{app}: {failure}" for failure in outcome["failures"]]


def check_cuesubmit(tmp: Path, farm: Farm) -> list[str]:
    failures = run_gui("cuesubmit", tmp, farm, timeout=120)
    if failures:
        return failures
    submitted = json.loads((tmp / "cuesubmit.json").read_text())["jobs"]
    try:
        for name in submitted:
            shown = farm.json("job", "show", name)
            say(
                f"cuesubmit: ok: `cuectl job show --json {name}`: id {shown['id']}, user {shown['user']}, "
                f"show {shown['show']}, shot {shown['shot']}, layers "
                + ", ".join(f"{layer['name']} {layer['range']} {layer['command']!r}" for layer in shown["layers"])
            )
            if shown["show"] != SHOW or shown["shot"] != "sh020":
                raise Failed(f"cuesubmit: job {name}: show/shot {shown['show']}/{shown['shot']}, not {SHOW}/sh020")

            def done() -> Any:
                farm.check_alive()
                frames = farm.json("frame", "list", "--job", str(shown["id"]))["frames"]
                if any(f["state"] in ("DEAD", "EATEN") for f in frames):
                    raise Failed(
                        f"cuesubmit: job {name}: a frame failed: "
                        + "; ".join(f"{f['name']} {f['state']} {f.get('failure')}" for f in frames)
                    )
                return frames if frames and all(f["state"] == "SUCCEEDED" for f in frames) else None

            frames = wait(f"cuesubmit: job {name}'s frames SUCCEEDED on the worker", done, 90)
            log = farm.run("frame", "log", f"{shown['id']}/{frames[0]['name']}")
            if "cuesubmit frame 1" not in log:
                raise Failed(f"cuesubmit: job {name}: frame {frames[0]['name']}'s log lacks its output: {log!r}")
            say(f"cuesubmit: ok: {len(frames)} frames SUCCEEDED on {frames[0]['host']}; log: {log.strip()!r}")
    except Failed as exc:
        return [str(exc)]
    return []


# -- inside each GUI program ---------------------------------------------------------------


class Recorder:
    """Every gRPC call pycue makes, by method and status code (a client-side interceptor on
    the channel pycue opens; nothing else of the client is touched)."""

    def __init__(self) -> None:
        self.calls: dict[str, int] = {}
        self.bad: list[str] = []
        self.lock = threading.Lock()

    def install(self) -> None:
        import grpc

        recorder = self
        real = grpc.insecure_channel

        class Interceptor(grpc.UnaryUnaryClientInterceptor):
            def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
                outcome = continuation(details, request)
                code = outcome.code()
                recorder.note(details.method, code.name if code is not None else "OK", outcome)
                return outcome

        def channel(*args: Any, **kwargs: Any) -> Any:
            return grpc.intercept_channel(real(*args, **kwargs), Interceptor())

        grpc.insecure_channel = channel

    def note(self, method: str, code: str, outcome: Any) -> None:
        key = method.rsplit(".", 1)[-1].replace("Interface/", ".")
        if code != "OK":
            key = f"{key}:{code}"
        with self.lock:
            self.calls[key] = self.calls.get(key, 0) + 1
            if code in BAD_CODES:
                try:
                    detail = outcome.details()
                except Exception:  # noqa: BLE001
                    detail = ""
                failure = f"{method} answered {code}: {detail}"
                if failure not in self.bad:
                    self.bad.append(failure)


class Gui:
    """A CueGUI program started as cuegui.Main.startup starts it (without its event loop: this
    drives it), and helpers to wait on it and read its widgets as a user sees them."""

    def __init__(self, name: str) -> None:
        import cuegui
        import cuegui.ActionRunner
        import cuegui.Constants
        import cuegui.Layout
        import cuegui.MainWindow
        import cuegui.Style
        import cuegui.ThreadPool
        from qtpy import QtCore, QtTest, QtWidgets  # noqa: F401

        self.QtCore, self.QtTest, self.QtWidgets = QtCore, QtTest, QtWidgets
        self.app = cuegui.create_app([name])
        self.app.setApplicationName(name)
        self.app.threadpool = cuegui.ThreadPool.ThreadPool(3, parent=self.app)
        self.app.action_runner = cuegui.ActionRunner.ActionRunner(parent=self.app)
        self.app.settings = cuegui.Layout.startup(name)
        cuegui.Style.init()
        self.window = cuegui.MainWindow.MainWindow(name, cuegui.Constants.VERSION, None)
        self.window.resize(1400, 860)
        self.window.show()
        self.spin(1)

    def spin(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            self.app.processEvents()
            time.sleep(0.02)

    def wait(
        self, what: str, probe: Callable[[], Any], timeout: float = 45, seen: Callable[[], str] | None = None
    ) -> Any:
        return wait(what, probe, timeout, tick=lambda: self.spin(0.2), seen=seen)

    def find(self, class_name: str) -> Any:
        """A widget by class name (plugins are imported under their own module names)."""
        found = [w for w in self.window.findChildren(self.QtWidgets.QWidget) if type(w).__name__ == class_name]
        if not found:
            raise Failed(f"no {class_name} in the {self.app.applicationName()} window")
        return found[0]

    def open_plugin(self, title: str) -> None:
        """Views/Plugins > ... > title, as a user opens it."""
        for menu in [self.window.PluginMenu, *self.window.PluginMenu.findChildren(self.QtWidgets.QMenu)]:
            for action in menu.actions():
                if action.text() == title:
                    action.trigger()
                    self.spin(0.5)
                    return
        raise Failed(f"Views/Plugins has no {title!r}")

    @staticmethod
    def rows(tree: Any) -> list[dict[str, str]]:
        """Every item of a tree widget (children too), as column title -> shown text."""
        heads = [tree.headerItem().text(c) for c in range(tree.columnCount())]
        out: list[dict[str, str]] = []

        def walk(item: Any) -> None:
            row = {}
            for col, head in enumerate(heads):
                row[f"#{col}"] = item.text(col)
                if head:
                    row.setdefault(head, item.text(col))
            row["__item__"] = item  # type: ignore[assignment]
            out.append(row)
            for i in range(item.childCount()):
                walk(item.child(i))

        for i in range(tree.topLevelItemCount()):
            walk(tree.topLevelItem(i))
        return out

    @staticmethod
    def show_rows(rows: list[dict[str, str]], *cols: str) -> str:
        return "; ".join(" ".join(f"{c}={r.get(c)!r}" for c in cols) for r in rows) or "no rows"

    def click(self, tree: Any, item: Any, double: bool = False) -> None:
        """A real mouse click (and double click) on ``item``'s row, as a user gives it."""
        tree.scrollToItem(item)
        point = tree.visualItemRect(item).center()
        left, none = self.QtCore.Qt.LeftButton, self.QtCore.Qt.NoModifier
        self.QtTest.QTest.mouseClick(tree.viewport(), left, none, point)
        if double:
            self.QtTest.QTest.mouseDClick(tree.viewport(), left, none, point)
        self.spin(0.3)

    def screenshot(self, widget: Any, path: Path) -> str:
        self.spin(0.5)
        image = widget.grab().toImage()
        image.save(str(path), "PNG")
        size = path.stat().st_size
        if size > SCREENSHOT_LIMIT:  # a smaller picture rather than a larger file
            image.scaledToWidth(int(image.width() * 0.8), self.QtCore.Qt.SmoothTransformation).save(str(path), "PNG")
            size = path.stat().st_size
        return f"screenshot {path} ({size // 1024} KiB)"

    def close(self) -> None:
        import cuegui.Main

        cuegui.Main.closingTime()


def gui_main(args: argparse.Namespace) -> int:
    """One GUI program; writes {passed, failures, calls} to --result and exits 0 (the
    orchestrator judges), or non-zero when it could not even report."""
    context = json.loads(Path(args.context).read_text())
    recorder = Recorder()
    recorder.install()
    passed: list[str] = []
    failures: list[str] = []
    extra: dict[str, Any] = {}
    gui = None
    try:
        if args.app == "cuesubmit":
            extra["jobs"] = cuesubmit(context, passed)
        else:
            gui = Gui("Cuetopia" if args.app == "cuetopia" else "CueCommander")
            (cuetopia if args.app == "cuetopia" else cuecommander)(gui, context, passed)
    except Failed as exc:
        failures.append(str(exc))
    except Exception as exc:  # noqa: BLE001 - the client's own error, reported as a failure
        import traceback

        traceback.print_exc()
        failures.append(f"{type(exc).__name__}: {exc}")
    if gui is not None:
        gui.spin(1)  # let the views' last polls land before judging the calls
    failures += recorder.bad
    Path(args.result).write_text(json.dumps({"passed": passed, "failures": failures, "calls": recorder.calls, **extra}))
    if gui is not None:
        gui.close()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # Qt's worker threads of CueGUI's views are not joined on exit; nothing to save


def cuetopia(gui: Gui, ctx: dict[str, Any], passed: list[str]) -> None:
    job, frame_number = ctx["job"], str(ctx["frame_number"])
    shots = Path(ctx["screenshots"])
    jobs_dock = gui.find("MonitorJobsDockWidget")
    jobs = jobs_dock.jobMonitor
    # A user's own jobs load by themselves ("Autoload Mine"); turn that off and load the job
    # by name, as for anyone's job: type it into "Load:" and press Enter.
    jobs_dock.autoLoadMineCb.setChecked(False)
    jobs.removeAllItems()
    box = gui.find("JobRegexLoadEditBox")
    box.clear()
    gui.QtTest.QTest.keyClicks(box, job)
    gui.QtTest.QTest.keyClick(box, gui.QtCore.Qt.Key_Return)
    row = gui.wait(
        f"Monitor Jobs lists {job}",
        lambda: next((r for r in gui.rows(jobs) if r["#0"] == job), None),
        seen=lambda: gui.show_rows(gui.rows(jobs), "#0", "State"),
    )
    if row.get("Running") != "1":
        raise Failed(
            f"Monitor Jobs: {job} shows Running {row.get('Running')!r}, not '1' "
            f"(state {row.get('State')!r}, done/total {row.get('Done/Total')!r})"
        )
    passed.append(
        f"Monitor Jobs lists {job}: State {row.get('State')!r}, Done/Total {row.get('Done/Total')!r}, "
        f"Running {row.get('Running')!r}, Wait {row.get('Wait')!r}"
    )

    gui.open_plugin("LogView")
    gui.window.resizeDocks([gui.find("LogViewPlugin")], [560], gui.QtCore.Qt.Horizontal)  # room for the lines
    gui.click(jobs, row["__item__"], double=True)  # double-click: Monitor Job Details shows it
    layers = gui.find("LayerMonitorTree")
    frames = gui.find("FrameMonitorTree")
    layer = gui.wait(
        "Monitor Job Details lists the job's layer render",
        lambda: next((r for r in gui.rows(layers) if r.get("Name") == "render"), None),
        seen=lambda: gui.show_rows(gui.rows(layers), "Name"),
    )
    if layer.get("Gpus") != "1" or layer.get("Total") != "3":
        raise Failed(f"layer render: Gpus {layer.get('Gpus')!r} Total {layer.get('Total')!r}, not '1' and '3'")
    passed.append(
        f"Monitor Job Details: layer render, Range {layer.get('Range')!r}, Gpus {layer.get('Gpus')!r}, "
        f"Total {layer.get('Total')!r}, Run {layer.get('Run')!r}"
    )

    def running_row() -> Any:
        rows = gui.rows(frames)
        if len(rows) < 3:
            return None
        return next((r for r in rows if r.get("Frame") == frame_number and r.get("Status") == "RUNNING"), None)

    frame = gui.wait(
        f"the frame monitor shows frame {frame_number} RUNNING among 3 frames",
        running_row,
        seen=lambda: gui.show_rows(gui.rows(frames), "Frame", "Status", "Host"),
    )
    others = sorted(r.get("Status") for r in gui.rows(frames) if r.get("Frame") != frame_number)
    if others != ["WAITING", "WAITING"]:
        raise Failed(f"the other frames show {others}, not WAITING (one runs at a time)")
    if not frame.get("Host", "").startswith(ctx["host"] + "/") or frame.get("GPUs") != "1":
        raise Failed(
            f"frame {frame_number}: Host {frame.get('Host')!r} GPUs {frame.get('GPUs')!r}, "
            f"not {ctx['host']}/... with 1 GPU"
        )
    passed.append(
        f"frame monitor: frame {frame_number} Status RUNNING, Host {frame.get('Host')!r}, "
        f"GPUs {frame.get('GPUs')!r}, Last Line {frame.get('Last Line')!r}; the others WAITING"
    )

    gui.click(frames, frame["__item__"])  # one click: LogView shows the frame's log
    logview = gui.find("LogViewWidget")
    expected = f"cuegui-check frame {frame_number} line "
    text = gui.wait(
        "LogView shows the running frame's log",
        lambda: expected in logview._content_box.toPlainText() and logview._content_box.toPlainText(),
        seen=lambda: f"it shows {logview._content_box.toPlainText()[-200:]!r}",
    )
    path = logview._path.text()
    if path != ctx["rqlog"]:
        raise Failed(f"LogView opened {path!r}, not {ctx['rqlog']!r} (<Job.log_dir>/<job>.<frame>.rqlog)")
    lines = [line for line in text.splitlines() if line.startswith(expected)]
    passed.append(f"LogView: {path} with {len(lines)} lines of the frame's output, last {lines[-1]!r}")
    frames.clearSelection()  # the screenshots show the Status cells' colours, not the selection
    gui.spin(1)
    passed.append(gui.screenshot(gui.window, shots / "cuegui-cuetopia.png"))
    passed.append(gui.screenshot(gui.find("MonitorLayerFramesDockWidget"), shots / "cuegui-frames.png"))


def cuecommander(gui: Gui, ctx: dict[str, Any], passed: list[str]) -> None:
    job, host = ctx["job"], ctx["host"]
    shots = Path(ctx["screenshots"])
    cue = gui.find("CueJobMonitorTree")
    gui.wait(
        f"Monitor Cue ($SHOW={SHOW}) lists {job}",
        lambda: any(r.get("Job") == job for r in gui.rows(cue)),
        seen=lambda: gui.show_rows(gui.rows(cue), "Job"),
    )
    passed.append(f"Monitor Cue lists {job} under show {SHOW}")

    gui.open_plugin("Monitor Hosts")
    hosts = gui.find("HostMonitorTree")
    row = gui.wait(
        f"Monitor Hosts lists {host}",
        lambda: next((r for r in gui.rows(hosts) if r.get("Name") == host), None),
        seen=lambda: gui.show_rows(gui.rows(hosts), "Name"),
    )
    if row.get("GPUs") != str(ctx["gpus"]) or row.get("Idle GPUs") != str(ctx["idle_gpus"]):
        raise Failed(
            f"Monitor Hosts: {host} shows GPUs {row.get('GPUs')!r}, Idle GPUs {row.get('Idle GPUs')!r}; "
            f"the store says {ctx['gpus']} and {ctx['idle_gpus']} idle (total minus the running frames')"
        )
    passed.append(
        f"Monitor Hosts: {host} GPUs {row.get('GPUs')!r}, Idle GPUs {row.get('Idle GPUs')!r}, "
        f"Cores {row.get('Cores')!r}, Idle Cores {row.get('Idle Cores')!r}, "
        f"GPU Mem {row.get('GPU Mem')!r}, GPU Mem Idle {row.get('GPU Mem Idle')!r}, {row.get('Hardware')!r}"
    )

    gui.click(hosts, row["__item__"], double=True)  # double-click a host: its procs below
    procs = gui.find("ProcMonitorTree")
    proc = gui.wait(
        f"the proc monitor lists the running frame on {host}",
        lambda: next((r for r in gui.rows(procs) if r.get("Job") == job), None),
        seen=lambda: gui.show_rows(gui.rows(procs), "Name", "Job"),
    )
    passed.append(
        f"procs of {host}: {proc.get('Name')!r} of {job}, Cores {proc.get('Cores')!r}, "
        f"Mem Reserved {proc.get('Mem Reserved')!r}"
    )
    passed.append(gui.screenshot(gui.window, shots / "cuegui-hosts.png"))


def cuesubmit(ctx: dict[str, Any], passed: list[str]) -> list[str]:
    """CueSubmit's submission function with the job data its window builds (Submit.getJobData:
    name, username, show, shot, layers as LayerData; a Shell layer's command in cmd's
    'commandTextBox')."""
    from cuesubmit import JobTypes, Submission
    from cuesubmit.Layer import LayerData

    layer = LayerData.buildFactory(
        name="hello",
        layerType=JobTypes.JobTypes.SHELL,
        cmd={"commandTextBox": "echo cuesubmit frame #IFRAME#"},
        layerRange="1-2",
        chunk="1",
        overrideCores=False,
        cores="1",
        env={},
        services=[],
        limits=[],
        dependType="",
        dependsOn=None,
    )
    job_data = {
        "name": "cuesubmit_check",
        "username": ctx["user"],
        "show": SHOW,
        "shot": "sh020",
        "layers": [layer],
        "facility": None,
    }
    jobs = Submission.submitJob(job_data)
    names = [job.name() for job in jobs]
    if not names:
        raise Failed("submitJob returned no job")
    passed.append(f"submitJob returned {', '.join(f'{j.name()} (id {j.id()})' for j in jobs)}")
    return names


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--screenshots", default=str(REPO / "docs" / "images"), help="directory for cuegui-*.png (default: docs/images)"
    )
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory and its logs")
    parser.add_argument("--app", choices=["cuetopia", "cuecommander", "cuesubmit"], help=argparse.SUPPRESS)
    parser.add_argument("--context", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.app:
        return gui_main(args)
    return orchestrate(args)


if __name__ == "__main__":
    sys.exit(main())
