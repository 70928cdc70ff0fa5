"""Why a frame attempt failed: a stable machine-readable kind, one human line, and whether
retrying can ever help.

:func:`classify` turns what the worker knows about an ended attempt (exit code or signal,
timeout, a pending user action, a launch error, kernel OOM evidence, the tail of the frame's
log) into a :class:`Failure`, or None for a success. Kinds (stable strings, stored and shown
to programs):

====================  ======================================================  =========
kind                  text                                                    permanent
====================  ======================================================  =========
``killed``            ``killed by a user`` / ``retried …`` / ``eaten …``      no
``lost``              ``worker lost (no heartbeat)``                          no
``launch``            the worker's message (``user 'bob' does not exist …``)  yes
``timeout``           ``timed out after 30 s``                                no
``oom-killed``        ``killed by the kernel's OOM killer (SIGKILL)``         no
``gpu-oom``           ``GPU out of memory: <the log line>``                   no
``not-found``         ``command not found (exit 127)``                        yes
``not-executable``    ``command not executable (exit 126)``                   yes
``signal``            ``killed by signal 9 (SIGKILL)``                        no
``exit``              ``exit 1``                                              no
``log-lost``          ``the log's filesystem was full: output was lost …``    no
``gpu-escape``        ``GPU escape: pid 4242 on GPU 1 (GPU-…), not given …``  no
``gpu-idle``          ``GPU idle: under 5 % on every device for 30m …``       no
``gpu-over-budget``   ``GPU share over budget: 12.0 GiB on GPU 0 …``          no
``device-failed``     ``device failed: Xid 79 on GPU 1 …`` (not counted)      no
====================  ======================================================  =========

The ``gpu-*`` kinds are the worker's own GPU policies (docs/gpu-health.md); a frame stopped
for ``gpu-escape`` is not retried on the same host. ``device-failed``: the frame's device was
drained as sick while it ran; the attempt is not the frame's failure and does not count
against its retries.

``permanent``: the same command on the same farm cannot succeed by running again, so the
frame should go DEAD at once instead of burning its retries.

Helpers: :func:`find_gpu_oom` (GPU out-of-memory messages of the common frameworks, as
they print them), :func:`read_log_tail` (the end of a log, never through a link), and
:func:`own_cgroup_dir` / :func:`oom_kill_count` (the kernel's OOM-kill counter of this
process's cgroup, readable without privileges).
"""

from __future__ import annotations

import re
import signal
from dataclasses import dataclass
from pathlib import Path

# The log's tail is read as every reader reads a log (run/framelog/read.py); importable from here.
from cuectl.run.framelog.read import DEFAULT_TAIL_BYTES, read_log_tail

__all__ = [
    "DEFAULT_TAIL_BYTES",
    "Failure",
    "KINDS",
    "PERMANENT_EXIT_CODES",
    "classify",
    "find_gpu_oom",
    "is_permanent_exit",
    "log_lost",
    "oom_kill_count",
    "own_cgroup_dir",
    "read_log_tail",
    "worker_lost",
]

KINDS = (
    "exit",
    "signal",
    "timeout",
    "oom-killed",
    "gpu-oom",
    "lost",
    "not-found",
    "not-executable",
    "launch",
    "killed",
    "log-lost",
    "gpu-escape",
    "gpu-idle",
    "gpu-over-budget",
    "device-failed",
)

# Shell conventions (launch.EXIT_NOT_FOUND / EXIT_CANNOT_EXECUTE): the command is missing or
# cannot be executed. Running it again on the same farm gives the same answer.
_EXIT_NOT_FOUND = 127
_EXIT_CANNOT_EXECUTE = 126
PERMANENT_EXIT_CODES = frozenset({_EXIT_NOT_FOUND, _EXIT_CANNOT_EXECUTE})

# The matched log line is shown in one-line listings: keep it short.
_LINE_LIMIT = 160

_USER_ACTIONS = {"kill": "killed by a user", "retry": "retried by a user", "eat": "eaten by a user"}


@dataclass(frozen=True)
class Failure:
    """Why one attempt failed. ``kind``: one of :data:`KINDS` (for programs); ``text``: one
    line for people; ``permanent``: retrying cannot help (the frame should go DEAD now)."""

    kind: str
    text: str
    permanent: bool


def is_permanent_exit(exit_code: int | None) -> bool:
    """Whether an exit code means the command itself cannot run (127 not found, 126 not
    executable). Limit: a script that exits 126/127 on purpose, or a command on a share not
    mounted on one host, reads the same; the retry rule prefers not to burn retries on the
    overwhelmingly common case, a typo or a missing program."""
    return exit_code in PERMANENT_EXIT_CODES


def worker_lost() -> Failure:
    """The attempt of a worker that stopped heartbeating (its lease expired; the reaper
    has no exit status). Not permanent: another host may well run it."""
    return Failure("lost", "worker lost (no heartbeat)", False)


def log_lost() -> Failure:
    """An attempt that exited 0 while its log's filesystem was full: part of its output
    never reached the log (a frame's log is its record), so it is not a clean success.
    Not permanent: cuectl freed the log's space, and another run may well fit."""
    return Failure("log-lost", "the log's filesystem was full: output was lost from the log", False)


def classify(
    *,
    exit_code: int | None,
    exit_signal: int | None,
    timed_out: bool,
    user_action: str | None = None,
    launch_error: str | None = None,
    log_tail: bytes = b"",
    oom_killed: bool = False,
    timeout_s: float | None = None,
    lost: bool = False,
) -> Failure | None:
    """Why an attempt failed, or None when it succeeded (exit 0, no signal, no timeout, no
    user action, no launch error).

    Precedence (the first that applies wins):

    1. ``user_action`` (``kill``/``retry``/``eat``): the user stopped it, whatever it did;
    2. ``lost``: the worker went silent, so nothing else is known;
    3. ``launch_error``: the worker could not start it (the worker also reports exit 126);
    4. ``timed_out`` (``timeout_s``, when given, goes into the text);
    5. ``oom_killed`` (the cgroup's OOM-kill counter rose during the attempt, see
       :func:`oom_kill_count`), only if the frame died of SIGKILL — or exited 137, which is
       how a shell reports a child killed by SIGKILL;
    6. a GPU out-of-memory message in ``log_tail`` (any non-zero exit or a signal);
    7. exit 127 / 126 (permanent);
    8. any other signal;
    9. any other non-zero exit.

    ``log_tail``: the end of the frame's log (:func:`read_log_tail`); only its last
    :data:`DEFAULT_TAIL_BYTES` are searched. An attempt with neither an exit code nor a signal
    (its status was lost) is an ``exit`` failure: it cannot be called a success.
    """
    if user_action is not None:
        text = _USER_ACTIONS.get(user_action, f"stopped by a user ({user_action})")
        # Not permanent: what happens next is the user's choice (next_state applies it).
        return Failure("killed", text, False)
    if lost:
        return worker_lost()
    if launch_error is not None:
        # Bad command, bad env, unknown user on this host: the same spec fails the same way.
        return Failure("launch", _one_line(launch_error) or "frame could not be started", True)
    if timed_out:
        text = "timed out" if timeout_s is None else f"timed out after {timeout_s:g} s"
        return Failure("timeout", text, False)
    if exit_signal is None and exit_code == 0:
        return None
    sigkill = int(signal.SIGKILL)
    if oom_killed and (exit_signal == sigkill or (exit_signal is None and exit_code == 128 + sigkill)):
        return Failure("oom-killed", "killed by the kernel's OOM killer (SIGKILL)", False)
    line = find_gpu_oom(log_tail)
    if line is not None:
        # Not permanent: a smaller neighbour on the device, another GPU model or a retry on an
        # idle card can fit; the retry limit bounds the cost when it never does.
        return Failure("gpu-oom", f"GPU out of memory: {line}", False)
    if exit_signal is None and exit_code == _EXIT_NOT_FOUND:
        return Failure("not-found", f"command not found (exit {_EXIT_NOT_FOUND})", True)
    if exit_signal is None and exit_code == _EXIT_CANNOT_EXECUTE:
        return Failure("not-executable", f"command not executable (exit {_EXIT_CANNOT_EXECUTE})", True)
    if exit_signal is not None:
        return Failure("signal", f"killed by signal {exit_signal} ({_signal_name(exit_signal)})", False)
    if exit_code is None:
        return Failure("exit", "exit status unknown", False)
    return Failure("exit", f"exit {exit_code}", False)


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:  # real-time signals past SIGRTMIN and numbers this OS lacks
        return "unknown signal"


def _one_line(text: str) -> str:
    # Stored and listed as one line: a multi-line exception message keeps its first line.
    for line in text.strip().splitlines():
        if line.strip():
            return line.strip()
    return ""


# --------------------------------------------------------------------------------------
# GPU out-of-memory messages
# --------------------------------------------------------------------------------------

# Each pattern is written after what the software prints, with its exact case: the error
# constants (CUDA_ERROR_OUT_OF_MEMORY) and Python class names are case-sensitive, and the
# few prose messages whose case varies between versions list both spellings. A bare
# "out of memory", "MemoryError" (host RAM in Python), "std::bad_alloc", "Cannot allocate
# memory" (ENOMEM) or the shell's "Killed" are deliberately *not* GPU evidence.
_GPU_OOM_PATTERNS = (
    # PyTorch (CUDA, ROCm/HIP, Intel XPU): "torch.OutOfMemoryError: CUDA out of memory. Tried to
    # allocate 20.00 MiB (GPU 0; ...)"; before 1.13 "RuntimeError: CUDA out of memory. ...".
    r"\b(?:CUDA|HIP|XPU) out of memory\. Tried to allocate",
    r"\btorch\.(?:cuda\.)?OutOfMemoryError\b",
    # PyTorch on Apple silicon: "RuntimeError: MPS backend out of memory (MPS allocated: ...".
    r"\bMPS backend out of memory\b",
    # The CUDA/HIP runtime's error string through PyTorch, ggml, Blender Cycles, C++ tools:
    # "RuntimeError: CUDA error: out of memory", "CUDA error: Out of memory in cuMemAlloc(...)",
    # PyTorch <= 0.4 "cuda runtime error (2) : out of memory", ggml "cudaMalloc failed: out of memory".
    r"\b(?:CUDA|HIP) error: [Oo]ut of memory\b",
    r"\bcuda runtime error \(2\) : out of memory\b",
    r"\b(?:cudaMalloc|hipMalloc)\w* failed: out of memory\b",
    # Driver / runtime error constants (numba, CuPy, pycuda, C++): CUDA driver API, CUDA
    # runtime API, ROCm HIP.
    r"\bCUDA_ERROR_OUT_OF_MEMORY\b",
    r"\bcudaErrorMemoryAllocation\b",
    r"\bhipErrorOutOfMemory\b",
    # CUDA libraries failing to allocate their workspace: "CUBLAS_STATUS_ALLOC_FAILED when
    # calling `cublasCreate(handle)`", "CUDNN_STATUS_ALLOC_FAILED", cuFFT's "CUFFT_ALLOC_FAILED".
    r"\b(?:CUBLAS|CUDNN|CUSOLVER|CUSPARSE)_STATUS_ALLOC_FAILED\b",
    r"\bCUFFT_ALLOC_FAILED\b",
    # CuPy: "cupy.cuda.memory.OutOfMemoryError: Out of memory allocating 1,073,741,824 bytes".
    r"\bcupy\.cuda\.memory\.OutOfMemoryError\b",
    # TensorFlow: "ResourceExhaustedError: OOM when allocating tensor with shape[...] and type
    # float on /job:localhost/replica:0/task:0/device:GPU:0 by allocator GPU_0_bfc" — the
    # OOM line may also stand alone, under a "Graph execution error" header.
    r"\bOOM when allocating tensor\b",
    # Bounded gap: an unbounded ".*" made a line repeating the class name quadratic.
    r"\bResourceExhaustedError\b.{0,200}?(?:\bOOM\b|[Oo]ut of memory|failed to allocate)",
    # JAX / XLA: "XlaRuntimeError: RESOURCE_EXHAUSTED: Out of memory while trying to allocate
    # 17179869184 bytes."; older jaxlib "RuntimeError: Resource exhausted: Out of memory ...".
    r"\bRESOURCE_EXHAUSTED: (?:Out of memory|Failed to allocate)",
    r"\bResource exhausted: Out of memory\b",
    # Blender Cycles: "System is out of GPU memory" / "System is out of GPU and shared host
    # memory", and its CUDA device code's "Out of memory in cuMemAlloc(&device_pointer, size)".
    r"\bSystem is out of GPU\b",
    r"\bOut of memory in cuMemAlloc",
    # Vulkan and OpenCL renderers/compute: device-memory allocation failures by name.
    r"\bVK_ERROR_OUT_OF_DEVICE_MEMORY\b",
    r"\bCL_MEM_OBJECT_ALLOCATION_FAILURE\b",
)
_GPU_OOM_RE = re.compile("|".join(f"(?:{p})" for p in _GPU_OOM_PATTERNS))
# TensorFlow says "OOM when allocating tensor" / ResourceExhaustedError for host RAM too;
# the device or allocator named on the line tells them apart.
_HOST_DEVICE_RE = re.compile(r"device:CPU:|\ballocator (?:cpu|mklcpu)\b")
# Colour codes (rich, tqdm, loguru) would split the words the patterns look for.
_ANSI_RE = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
# The worker writes this before each attempt: in a log shared by several attempts only the
# last one's output is evidence about the last attempt (launch.log_header).
# (Not its footer, launch.log_footer: "=== cuectl frame F attempt N ended …".)
_ATTEMPT_HEADER = re.compile(rb"=== cuectl frame [^\n]*? attempt [0-9]+ on ")


def find_gpu_oom(log_tail: bytes) -> str | None:
    """The last line of ``log_tail`` that reports a GPU out-of-memory error, stripped and
    trimmed to about 160 characters (around the message), or None.

    Only the last :data:`DEFAULT_TAIL_BYTES` are searched, and only what follows the last
    cuectl attempt header among them. Lines end at ``\\n`` or ``\\r`` (progress bars).
    """
    data = log_tail[-DEFAULT_TAIL_BYTES:]
    headers = list(_ATTEMPT_HEADER.finditer(data))
    if headers:
        data = data[headers[-1].start() :]
    text = _ANSI_RE.sub("", data.decode("utf-8", "replace"))
    # The last message is the one that ended the process; earlier ones may have been caught
    # and retried by the program (e.g. a batch-size search).
    for line in reversed(re.split(r"[\r\n]+", text)):
        match = _GPU_OOM_RE.search(line)
        if match is None or _HOST_DEVICE_RE.search(line):
            continue
        return _excerpt(line, match.start(), match.end())
    return None


def _excerpt(line: str, start: int, end: int) -> str:
    """``line`` stripped, cut to :data:`_LINE_LIMIT` characters so that the match stays in."""
    lead = len(line) - len(line.lstrip())
    line, start, end = line.strip(), start - lead, end - lead
    if len(line) <= _LINE_LIMIT:
        return line
    # Start at the line's beginning when the match fits, else at the match (long log
    # prefixes such as timestamps and source locations are the least useful part).
    if end <= _LINE_LIMIT - 1:
        return line[: _LINE_LIMIT - 1].rstrip() + "…"
    rest = line[start:]
    if len(rest) <= _LINE_LIMIT - 1:
        return "…" + rest
    return "…" + rest[: _LINE_LIMIT - 2].rstrip() + "…"


# --------------------------------------------------------------------------------------
# Kernel OOM evidence (cgroups)
# --------------------------------------------------------------------------------------


def own_cgroup_dir(
    *,
    cgroup_file: Path = Path("/proc/self/cgroup"),
    mountinfo: Path = Path("/proc/self/mountinfo"),
) -> Path | None:
    """The directory of this process's memory cgroup that carries an OOM-kill counter, or None.

    cgroup v2 first: the ``0::/path`` line of ``/proc/self/cgroup`` under the cgroup2 mount
    (found in ``/proc/self/mountinfo``; ``/sys/fs/cgroup`` if none is listed), used when it has
    ``memory.events``. Otherwise cgroup v1 (still common on hybrid hosts): the ``memory``
    controller's line under the v1 memory mount, used when it has ``memory.oom_control``.
    None on other systems (macOS), in the v2 root cgroup (which has no ``memory.events``) and
    when the files cannot be read. No privileges needed.
    """
    try:
        lines = cgroup_file.read_text().splitlines()
    except OSError:
        return None
    mounts = _cgroup_mounts(mountinfo)
    v2_path: str | None = None
    v1_path: str | None = None
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hierarchy, controllers, path = parts
        if hierarchy == "0" and controllers == "":
            v2_path = path
        elif "memory" in controllers.split(","):
            v1_path = path
    if v2_path is not None:
        for mount_point, mount_root in mounts.get("cgroup2", [(Path("/sys/fs/cgroup"), "/")]):
            found = _under_mount(mount_point, mount_root, v2_path)
            if found is not None and (found / "memory.events").is_file():
                return found
    if v1_path is not None:
        for mount_point, mount_root in mounts.get("memory", [(Path("/sys/fs/cgroup/memory"), "/")]):
            found = _under_mount(mount_point, mount_root, v1_path)
            if found is not None and (found / "memory.oom_control").is_file():
                return found
    return None


def _cgroup_mounts(mountinfo: Path) -> dict[str, list[tuple[Path, str]]]:
    """Cgroup mounts from mountinfo: ``{"cgroup2": [...], "memory": [...]}`` as (mount point,
    root of the mount within the hierarchy). Empty when unreadable."""
    mounts: dict[str, list[tuple[Path, str]]] = {}
    try:
        text = mountinfo.read_text()
    except OSError:
        return mounts
    for line in text.splitlines():
        # "36 25 0:31 /root /mount/point opts [optional fields] - fstype source superopts"
        left, sep, right = line.partition(" - ")
        if not sep:
            continue
        fields, tail = left.split(), right.split()
        if len(fields) < 5 or len(tail) < 3:
            continue
        root, point = _unescape(fields[3]), Path(_unescape(fields[4]))
        fstype, superopts = tail[0], tail[2].split(",")
        if fstype == "cgroup2":
            mounts.setdefault("cgroup2", []).append((point, root))
        elif fstype == "cgroup" and "memory" in superopts:
            mounts.setdefault("memory", []).append((point, root))
    return mounts


def _unescape(field: str) -> str:
    # mountinfo writes space, tab, newline and backslash in paths as octal escapes (\040).
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def _under_mount(mount_point: Path, mount_root: str, cgroup_path: str) -> Path | None:
    """Where ``cgroup_path`` (as /proc/self/cgroup names it) lies under a mount of the
    hierarchy whose root is ``mount_root``; None when the mount does not contain it."""
    root = mount_root.rstrip("/")
    if cgroup_path != root and not cgroup_path.startswith(root + "/"):
        return None
    rel = cgroup_path[len(root) :].lstrip("/")
    # A "(deleted)" or ".." path would point outside the mount: ignore it.
    if ".." in rel.split("/"):
        return None
    return mount_point / rel if rel else mount_point


def oom_kill_count(cgroup_dir: Path | None = None) -> int | None:
    """How many processes the kernel's OOM killer has killed in a cgroup (default: this
    process's, :func:`own_cgroup_dir`); None when unavailable.

    Reads ``oom_kill`` from ``memory.events`` (cgroup v2), which counts kills by any OOM
    killer — the cgroup's own limit or the whole machine running out — in the cgroup *and
    its descendants*. ``memory.events.local`` is not used on purpose: a frame that starts
    its own sub-cgroups (systemd-run, containers) must still count. On cgroup v1 the
    ``oom_kill`` line of ``memory.oom_control`` (Linux >= 4.13) is read instead; it counts
    this cgroup only.

    The worker reads it before and after a frame: a frame that died of SIGKILL while the
    counter rose was, almost surely, OOM-killed. Limit: the counter is per cgroup, not per
    process — another frame or the worker in the same cgroup being OOM-killed at the same
    time raises it too, so with several frames running a SIGKILL death from another cause
    (a user's ``kill -9``) can be mistaken for an OOM kill.
    """
    directory = own_cgroup_dir() if cgroup_dir is None else cgroup_dir
    if directory is None:
        return None
    for name in ("memory.events", "memory.oom_control"):
        try:
            text = (directory / name).read_text()
        except OSError:
            continue
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                try:
                    return int(value.strip())
                except ValueError:
                    return None
    return None
