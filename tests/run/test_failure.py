"""Failure reasons (cuectl.run.failure): kinds and precedence, GPU out-of-memory messages as
the frameworks print them, the log tail, and the cgroup OOM-kill counter."""

from __future__ import annotations

import os
import re
import signal
import subprocess
from pathlib import Path

import pytest

from cuectl.run import failure
from cuectl.run.failure import Failure, classify, find_gpu_oom, oom_kill_count, own_cgroup_dir, read_log_tail

SIGKILL = int(signal.SIGKILL)


def _exit(code: int, **kw: object) -> Failure | None:
    return classify(exit_code=code, exit_signal=None, timed_out=False, **kw)  # type: ignore[arg-type]


# -- kinds and precedence ------------------------------------------------------------------


def test_success_is_none() -> None:
    assert _exit(0) is None
    # An OOM message in the log of a frame that succeeded anyway (it caught the error and
    # retried with a smaller batch) is not a failure.
    assert _exit(0, log_tail=b"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2 GiB\n") is None


def test_exit() -> None:
    assert _exit(1) == Failure("exit", "exit 1", False)
    assert _exit(137) == Failure("exit", "exit 137", False)


def test_unknown_status_is_a_failure() -> None:
    assert classify(exit_code=None, exit_signal=None, timed_out=False) == Failure("exit", "exit status unknown", False)


def test_signal() -> None:
    got = classify(exit_code=None, exit_signal=SIGKILL, timed_out=False)
    assert got == Failure("signal", "killed by signal 9 (SIGKILL)", False)
    got = classify(exit_code=None, exit_signal=int(signal.SIGSEGV), timed_out=False)
    assert got is not None and got.text == f"killed by signal {int(signal.SIGSEGV)} (SIGSEGV)"


def test_unknown_signal_number() -> None:
    got = classify(exit_code=None, exit_signal=200, timed_out=False)
    assert got == Failure("signal", "killed by signal 200 (unknown signal)", False)


def test_timeout() -> None:
    got = classify(exit_code=None, exit_signal=int(signal.SIGTERM), timed_out=True, timeout_s=30)
    assert got == Failure("timeout", "timed out after 30 s", False)
    assert classify(exit_code=0, exit_signal=None, timed_out=True, timeout_s=1.5) == Failure(
        "timeout", "timed out after 1.5 s", False
    )
    got = classify(exit_code=None, exit_signal=SIGKILL, timed_out=True)
    assert got is not None and (got.kind, got.text) == ("timeout", "timed out")


def test_oom_killed_only_with_sigkill() -> None:
    got = classify(exit_code=None, exit_signal=SIGKILL, timed_out=False, oom_killed=True)
    assert got == Failure("oom-killed", "killed by the kernel's OOM killer (SIGKILL)", False)
    # A shell leader reports its child's SIGKILL as 128 + 9.
    assert _exit(137, oom_killed=True) == got
    # The counter rose (another process in the cgroup) but this frame failed otherwise.
    assert _exit(1, oom_killed=True) == Failure("exit", "exit 1", False)
    seg = classify(exit_code=None, exit_signal=int(signal.SIGSEGV), timed_out=False, oom_killed=True)
    assert seg is not None and seg.kind == "signal"


def test_gpu_oom_kind() -> None:
    tail = b"step 12\ntorch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 7.8 GiB)\n"
    got = _exit(1, log_tail=tail)
    assert got == Failure(
        "gpu-oom",
        "GPU out of memory: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 7.8 GiB)",
        False,
    )
    # Also when the process died of a signal (an abort after the error).
    sig = classify(exit_code=None, exit_signal=int(signal.SIGABRT), timed_out=False, log_tail=tail)
    assert sig is not None and sig.kind == "gpu-oom"


def test_not_found_and_not_executable_are_permanent() -> None:
    assert _exit(127) == Failure("not-found", "command not found (exit 127)", True)
    assert _exit(126) == Failure("not-executable", "command not executable (exit 126)", True)
    assert failure.is_permanent_exit(127) and failure.is_permanent_exit(126)
    assert not failure.is_permanent_exit(1) and not failure.is_permanent_exit(None)


def test_launch_error_is_permanent_and_wins_over_126() -> None:
    # The worker reports a frame it could not start as exit 126 with the message.
    got = _exit(126, launch_error="user 'bob' does not exist on this host")
    assert got == Failure("launch", "user 'bob' does not exist on this host", True)
    got = _exit(126, launch_error="command: empty argv\n  more detail")
    assert got is not None and got.text == "command: empty argv"


def test_user_action_wins_over_everything() -> None:
    for action, text in [("kill", "killed by a user"), ("retry", "retried by a user"), ("eat", "eaten by a user")]:
        got = classify(
            exit_code=None,
            exit_signal=int(signal.SIGTERM),
            timed_out=True,
            user_action=action,
            launch_error="x",
            oom_killed=True,
            log_tail=b"CUDA error: out of memory\n",
        )
        assert got == Failure("killed", text, False)
    # Even a frame that exited 0 after the user's kill request was acted on.
    got = _exit(0, user_action="kill")
    assert got is not None and got.kind == "killed"


def test_lost() -> None:
    assert failure.worker_lost() == Failure("lost", "worker lost (no heartbeat)", False)
    assert classify(exit_code=None, exit_signal=None, timed_out=False, lost=True) == failure.worker_lost()
    got = classify(exit_code=None, exit_signal=None, timed_out=False, lost=True, user_action="eat")
    assert got is not None and got.kind == "killed"


def test_precedence_timeout_over_oom_and_gpu() -> None:
    got = classify(
        exit_code=None,
        exit_signal=SIGKILL,
        timed_out=True,
        oom_killed=True,
        log_tail=b"RuntimeError: CUDA error: out of memory\n",
    )
    assert got is not None and got.kind == "timeout"
    got = classify(
        exit_code=None,
        exit_signal=SIGKILL,
        timed_out=False,
        oom_killed=True,
        log_tail=b"RuntimeError: CUDA error: out of memory\n",
    )
    assert got is not None and got.kind == "oom-killed"
    # A GPU OOM message beats the exit code, even 127 from a wrapper script.
    got = _exit(127, log_tail=b"RuntimeError: CUDA error: out of memory\n")
    assert got is not None and got.kind == "gpu-oom" and not got.permanent


def test_every_kind_is_listed() -> None:
    assert set(failure.KINDS) == {
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
    }
    # ... and each is in the module's table of kinds, which programs and docs/json.md read.
    documented = set(re.findall(r"^``([a-z-]+)``\s", failure.__doc__ or "", re.M))
    assert documented == set(failure.KINDS)


# -- GPU out of memory, as the frameworks print it -----------------------------------------

PYTORCH_2 = """\
Epoch 3:  41%|████      | 412/1000 [01:02<01:29,  6.57it/s, loss=0.412]
Traceback (most recent call last):
  File "/home/ana/train.py", line 88, in <module>
    main()
  File "/home/ana/train.py", line 71, in main
    loss = model(batch).loss
  File "/opt/venv/lib/python3.11/site-packages/torch/nn/modules/module.py", line 1532, in _wrapped_call_impl
    return self._call_impl(*args, **kwargs)
torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity of 23.65 GiB \
of which 3.56 MiB is free. Including non-PyTorch memory, this process has 23.63 GiB memory in use. Of the allocated \
memory 22.91 GiB is allocated by PyTorch, and 301.84 MiB is reserved by PyTorch but unallocated. If reserved but \
unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  \
See documentation for Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)
wandb: Waiting for W&B process to finish... (failed 1).
"""

PYTORCH_1_13 = """\
  File "/opt/conda/lib/python3.9/site-packages/torch/nn/functional.py", line 1457, in relu
    result = torch.relu(input)
torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 15.78 GiB total capacity; \
13.10 GiB already allocated; 1.12 GiB free; 13.60 GiB reserved in total by PyTorch) If reserved memory is >> \
allocated memory try setting max_split_size_mb to avoid fragmentation.
"""

PYTORCH_OLD = """\
  File "train.py", line 40, in forward
    x = self.conv1(x)
RuntimeError: CUDA out of memory. Tried to allocate 512.00 MiB (GPU 0; 10.76 GiB total capacity; 9.41 GiB \
already allocated; 315.44 MiB free; 9.45 GiB reserved in total by PyTorch)
Exception ignored in: <function _MultiProcessingDataLoaderIter.__del__ at 0x7f>
"""

PYTORCH_CUDA_ERROR = """\
  File "/workspace/infer.py", line 12, in <module>
    model = model.to("cuda")
RuntimeError: CUDA error: out of memory
CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below might be \
incorrect.
For debugging consider passing CUDA_LAUNCH_BLOCKING=1.
Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.
"""

PYTORCH_ROCM = """\
  File "/app/bench.py", line 30, in run
    y = x @ w
torch.OutOfMemoryError: HIP out of memory. Tried to allocate 8.00 GiB. GPU 0 has a total capacity of 63.98 GiB \
of which 1.20 GiB is free. Of the allocated memory 61.50 GiB is allocated by PyTorch.
done cleanup
"""

PYTORCH_MPS = """\
  File "/Users/ana/sd/run.py", line 77, in denoise
    h = self.attn(h)
RuntimeError: MPS backend out of memory (MPS allocated: 17.71 GB, other allocations: 428.00 KB, max allowed: \
18.13 GB). Tried to allocate 1.00 GB on private pool. Use PYTORCH_MPS_HIGH_WATERMARK_RATIO=0.0 to disable upper \
limit for memory allocations (may cause system failure).
"""

PYTORCH_CUBLAS = """\
  File "/opt/venv/lib/python3.10/site-packages/torch/nn/modules/linear.py", line 114, in forward
    return F.linear(input, self.weight, self.bias)
RuntimeError: CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`
"""

CUDNN = """\
  File "/opt/venv/lib/python3.8/site-packages/torch/nn/modules/conv.py", line 443, in _conv_forward
    return F.conv2d(input, weight, bias, self.stride,
RuntimeError: cuDNN error: CUDNN_STATUS_ALLOC_FAILED
"""

NUMBA_DRIVER = """\
  File "/opt/venv/lib/python3.11/site-packages/numba/cuda/cudadrv/driver.py", line 1365, in _attempt_allocation
    return allocator()
numba.cuda.cudadrv.driver.CudaAPIError: [2] Call to cuMemAlloc results in CUDA_ERROR_OUT_OF_MEMORY
"""

CUPY_RUNTIME = """\
  File "cupy/cuda/memory.pyx", line 1350, in cupy.cuda.memory.SingleDeviceMemoryPool._malloc
  File "cupy_backends/cuda/api/runtime.pyx", line 144, in cupy_backends.cuda.api.runtime.check_status
cupy_backends.cuda.api.runtime.CUDARuntimeError: cudaErrorMemoryAllocation: out of memory
"""

CUPY_POOL = """\
  File "cupy/cuda/memory.pyx", line 1327, in cupy.cuda.memory.SingleDeviceMemoryPool._try_malloc
cupy.cuda.memory.OutOfMemoryError: Out of memory allocating 1,073,741,824 bytes (allocated so far: 0 bytes).
"""

TENSORFLOW = """\
2024-03-01 10:12:40.123456: W tensorflow/core/common_runtime/bfc_allocator.cc:479] ****************************xx
2024-03-01 10:12:40.123501: W tensorflow/core/framework/op_kernel.cc:1828] OP_REQUIRES failed at \
matmul_op_impl.h:728 : RESOURCE_EXHAUSTED: OOM when allocating tensor with shape[32768,32768] and type float on \
/job:localhost/replica:0/task:0/device:GPU:0 by allocator GPU_0_bfc
Traceback (most recent call last):
  File "/srv/tf_train.py", line 51, in <module>
    model.fit(ds, epochs=10)
tensorflow.python.framework.errors_impl.ResourceExhaustedError: {{function_node __wrapped__MatMul_device_/job:\
localhost/replica:0/task:0/device:GPU:0}} OOM when allocating tensor with shape[32768,32768] and type float on \
/job:localhost/replica:0/task:0/device:GPU:0 by allocator GPU_0_bfc [Op:MatMul]
"""

TENSORFLOW_GRAPH = """\
Traceback (most recent call last):
  File "/srv/keras_fit.py", line 20, in <module>
    model.fit(x, y, batch_size=4096)
tensorflow.python.framework.errors_impl.ResourceExhaustedError: Graph execution error:

Detected at node 'model/dense/MatMul' defined at (most recent call last):
    File "/srv/keras_fit.py", line 20, in <module>
OOM when allocating tensor with shape[4096,65536] and type float on /job:localhost/replica:0/task:0/device:GPU:0 \
by allocator GPU_0_bfc
\t [[{{node model/dense/MatMul}}]]
Hint: If you want to see a list of allocated tensors when OOM happens, add report_tensor_allocations_upon_oom to \
RunOptions for current allocation info.
"""

JAX = """\
2024-05-02 14:03:11.401234: W external/xla/xla/tsl/framework/bfc_allocator.cc:482] Allocator (GPU_0_bfc) ran out \
of memory trying to allocate 16.00GiB (rounded to 17179869184)requested by op
Traceback (most recent call last):
  File "/home/ana/jax_run.py", line 9, in <module>
    y = jnp.ones((1 << 32,), dtype=jnp.float32)
jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED: Out of memory while trying to allocate 17179869184 bytes.
--------------------
For simplicity, JAX has removed its internal frames from the traceback of the following exception.
"""

JAX_OLD = """\
  File "/usr/lib/python3/dist-packages/jax/interpreters/xla.py", line 360, in _execute_compiled
RuntimeError: Resource exhausted: Out of memory while trying to allocate 8589934592 bytes.
"""

ROCM = """\
[rank0]: hip runtime: launching kernel gemm_kernel
hipMalloc(&ptr, 34359738368) failed: hipErrorOutOfMemory (out of memory) at /src/alloc.cpp:91
terminate called after throwing an instance of 'std::runtime_error'
"""

BLENDER_CYCLES = """\
Fra:1 Mem:1812.40M (Peak 1812.70M) | Time:00:03.41 | Mem:4012.00M, Peak:4012.00M | Scene, ViewLayer | Updating \
Device
Fra:1 Mem:1812.40M (Peak 1812.70M) | Time:00:05.02 | Mem:7940.00M, Peak:7940.00M | Scene, ViewLayer | System is \
out of GPU memory
Error: System is out of GPU memory
Blender quit
"""

BLENDER_CUMEMALLOC = """\
Fra:12 Mem:950.22M (Peak 980.10M) | Time:00:21.77 | Remaining:01:02.11 | Mem:5890.40M, Peak:5891.00M | Scene, \
RenderLayer | Path Tracing Tile 8/24
CUDA error: Out of memory in cuMemAlloc(&device_pointer, size), line 568 in device_cuda.cpp
Error: Out of memory in cuMemAlloc(&device_pointer, size)
Blender quit
"""

LLAMA_CPP = """\
llm_load_tensors: offloading 80 repeating layers to GPU
ggml_backend_cuda_buffer_type_alloc_buffer: allocating 38912.00 MiB on device 0: cudaMalloc failed: out of memory
llama_model_load: error loading model: unable to allocate backend buffer
"""

VULKAN = """\
[render] uploading 2048 textures
vkAllocateMemory failed with VK_ERROR_OUT_OF_DEVICE_MEMORY
[render] aborting
"""


@pytest.mark.parametrize(
    "log, expect",
    [
        (PYTORCH_2, "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0"),
        (PYTORCH_1_13, "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"),
        (PYTORCH_OLD, "RuntimeError: CUDA out of memory. Tried to allocate 512.00 MiB"),
        (PYTORCH_CUDA_ERROR, "RuntimeError: CUDA error: out of memory"),
        (PYTORCH_ROCM, "torch.OutOfMemoryError: HIP out of memory. Tried to allocate 8.00 GiB"),
        (PYTORCH_MPS, "RuntimeError: MPS backend out of memory (MPS allocated"),
        (PYTORCH_CUBLAS, "RuntimeError: CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling"),
        (CUDNN, "RuntimeError: cuDNN error: CUDNN_STATUS_ALLOC_FAILED"),
        (NUMBA_DRIVER, "numba.cuda.cudadrv.driver.CudaAPIError: [2] Call to cuMemAlloc results in CUDA_ERROR_OUT"),
        (CUPY_RUNTIME, "cupy_backends.cuda.api.runtime.CUDARuntimeError: cudaErrorMemoryAllocation: out of memory"),
        (CUPY_POOL, "cupy.cuda.memory.OutOfMemoryError: Out of memory allocating 1,073,741,824 bytes"),
        (TENSORFLOW, "tensorflow.python.framework.errors_impl.ResourceExhaustedError: {{function_node"),
        (TENSORFLOW_GRAPH, "OOM when allocating tensor with shape[4096,65536]"),
        (JAX, "jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED: Out of memory while trying to allocate"),
        (JAX_OLD, "RuntimeError: Resource exhausted: Out of memory while trying to allocate 8589934592 bytes."),
        (ROCM, "hipMalloc(&ptr, 34359738368) failed: hipErrorOutOfMemory (out of memory)"),
        (BLENDER_CYCLES, "Error: System is out of GPU memory"),
        (BLENDER_CUMEMALLOC, "Error: Out of memory in cuMemAlloc(&device_pointer, size)"),
        (LLAMA_CPP, "ggml_backend_cuda_buffer_type_alloc_buffer: allocating 38912.00 MiB on device 0: cudaMalloc"),
        (VULKAN, "vkAllocateMemory failed with VK_ERROR_OUT_OF_DEVICE_MEMORY"),
    ],
    ids=[
        "pytorch2",
        "pytorch1.13",
        "pytorch-old",
        "cuda-error",
        "rocm-hip",
        "mps",
        "cublas",
        "cudnn",
        "numba",
        "cupy-runtime",
        "cupy-pool",
        "tensorflow",
        "tensorflow-graph",
        "jax",
        "jax-old",
        "hip-runtime",
        "blender-cycles",
        "blender-cumemalloc",
        "llama.cpp",
        "vulkan",
    ],
)
def test_framework_messages(log: str, expect: str) -> None:
    line = find_gpu_oom(log.encode())
    assert line is not None and line.startswith(expect), line
    assert len(line) <= 160
    got = _exit(1, log_tail=log.encode())
    assert got is not None and got.kind == "gpu-oom" and got.text == f"GPU out of memory: {line}"


def test_long_line_keeps_the_message() -> None:
    # A long log prefix before the message: the excerpt starts at the message.
    line = (
        "2024-05-02 14:03:11.401234: E external/xla/xla/pjrt/pjrt_stream_executor_client.cc:2732] "
        + "Execution of replica 0 failed: " * 4
        + "RESOURCE_EXHAUSTED: Out of memory while trying to allocate "
        + "17179869184 bytes."
        + " x" * 100
    )
    got = find_gpu_oom(line.encode())
    assert got is not None and got.startswith("…RESOURCE_EXHAUSTED: Out of memory") and got.endswith("…")
    assert len(got) <= 160


@pytest.mark.parametrize(
    "log",
    [
        # Host RAM in Python.
        'Traceback (most recent call last):\n  File "x.py", line 1, in <module>\n'
        "    a = bytearray(1 << 40)\nMemoryError\n",
        "numpy.core._exceptions._ArrayMemoryError: Unable to allocate 64.0 GiB for an array with shape "
        "(8589934592,) and data type float64\n",
        # The shell reporting a kernel OOM kill, and C++/libc host allocation failures.
        "/var/spool/cue/run.sh: line 3: 41721 Killed                  python train.py\n",
        "terminate called after throwing an instance of 'std::bad_alloc'\n  what():  std::bad_alloc\n",
        "cp: error writing 'out.exr': Cannot allocate memory\n",
        # Innocuous mentions.
        "Using 12.0 GiB of GPU memory for the texture cache\nreduced batch size to stay within memory\n",
        "INFO: tip: to avoid running out of memory, lower --tile-size\n",
        "Peak memory: 3.2 GiB; no out-of-memory events\n",
        # TensorFlow running out of *host* RAM names a CPU device / allocator.
        "tensorflow.python.framework.errors_impl.ResourceExhaustedError: OOM when allocating tensor with "
        "shape[100000,100000] and type float on /job:localhost/replica:0/task:0/device:CPU:0 by allocator cpu\n",
        "",
    ],
    ids=[
        "python-memoryerror",
        "numpy",
        "shell-killed",
        "bad-alloc",
        "enomem",
        "gpu-memory-mention",
        "tip",
        "no-oom",
        "tensorflow-cpu",
        "empty",
    ],
)
def test_not_gpu_oom(log: str) -> None:
    assert find_gpu_oom(log.encode()) is None
    assert _exit(1, log_tail=log.encode()) == Failure("exit", "exit 1", False)


def test_last_match_wins_and_ansi_is_ignored() -> None:
    log = (
        b"RuntimeError: CUDA error: out of memory  (caught, retrying with batch 16)\n"
        b"\x1b[31mtorch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.00 GiB\x1b[0m\n"
    )
    assert find_gpu_oom(log) == "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.00 GiB"


def test_only_the_last_attempt_counts() -> None:
    log = (
        b"=== cuectl frame 7 attempt 1 on h1 at 2024-01-01T00:00:00Z ===\n"
        b"RuntimeError: CUDA error: out of memory\n"
        b"=== cuectl frame 7 attempt 2 on h1 at 2024-01-01T00:01:00Z ===\n"
        b"ValueError: bad input\n"
    )
    assert find_gpu_oom(log) is None


def test_only_the_tail_is_scanned() -> None:
    log = b"RuntimeError: CUDA error: out of memory\n" + b"x" * (failure.DEFAULT_TAIL_BYTES + 10) + b"\n"
    assert find_gpu_oom(log) is None


def test_undecodable_bytes() -> None:
    log = b"\xff\xfe\x80garbage\nRuntimeError: CUDA error: out of memory\n\xc3"
    assert find_gpu_oom(log) == "RuntimeError: CUDA error: out of memory"


# -- the log tail ----------------------------------------------------------------------------


def test_read_log_tail_of_a_big_file(tmp_path: Path) -> None:
    log = tmp_path / "big.log"
    with open(log, "wb") as fh:
        fh.seek(64 * 1024 * 1024)  # sparse 64 MiB of zeros, then the end we want
        fh.write(b"\nthe end\n")
    tail = read_log_tail(log, limit=100)
    assert len(tail) == 100 and tail.endswith(b"\nthe end\n") and tail.startswith(b"\0")
    assert read_log_tail(log).endswith(b"the end\n") and len(read_log_tail(log)) == failure.DEFAULT_TAIL_BYTES


def test_read_log_tail_small_missing_and_empty(tmp_path: Path) -> None:
    small = tmp_path / "small.log"
    small.write_bytes(b"abc\n")
    assert read_log_tail(small) == b"abc\n"
    assert read_log_tail(small, limit=0) == b""
    assert read_log_tail(tmp_path / "missing.log") == b""
    assert read_log_tail(tmp_path / "missing-dir" / "x.log") == b""
    (tmp_path / "empty.log").write_bytes(b"")
    assert read_log_tail(tmp_path / "empty.log") == b""
    assert read_log_tail(tmp_path) == b""  # a directory


def test_read_log_tail_does_not_follow_a_symlink(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_bytes(b"RuntimeError: CUDA error: out of memory\n")
    link = tmp_path / "frame.log"
    link.symlink_to(secret)
    assert read_log_tail(link) == b""
    dangling = tmp_path / "dangling.log"
    dangling.symlink_to(tmp_path / "nowhere")
    assert read_log_tail(dangling) == b""


def test_read_log_tail_fifo_does_not_block(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo.log"
    os.mkfifo(fifo)
    assert read_log_tail(fifo) == b""


def test_real_frame_process_gpu_oom(tmp_path: Path) -> None:
    log = tmp_path / "frame.log"
    with open(log, "ab") as fh:
        rc = subprocess.run(
            [
                "sh",
                "-c",
                'echo "loading"; echo "RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB" >&2; exit 1',
            ],
            stdout=fh,
            stderr=subprocess.STDOUT,
            timeout=30,
        ).returncode
    assert rc == 1
    got = classify(exit_code=rc, exit_signal=None, timed_out=False, log_tail=read_log_tail(log))
    assert got == Failure(
        "gpu-oom", "GPU out of memory: RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB", False
    )


def test_real_frame_process_killed(tmp_path: Path) -> None:
    proc = subprocess.run(["sh", "-c", "kill -9 $$"], timeout=30)
    assert proc.returncode == -SIGKILL
    got = classify(exit_code=None, exit_signal=-proc.returncode, timed_out=False)
    assert got == Failure("signal", "killed by signal 9 (SIGKILL)", False)


# -- cgroup OOM-kill counter -----------------------------------------------------------------

MEMORY_EVENTS = "low 0\nhigh 0\nmax 12\noom 4\noom_kill 3\noom_group_kill 0\n"


def test_oom_kill_count_v2(tmp_path: Path) -> None:
    (tmp_path / "memory.events").write_text(MEMORY_EVENTS)
    assert oom_kill_count(tmp_path) == 3


def test_oom_kill_count_v1(tmp_path: Path) -> None:
    (tmp_path / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 5\n")
    assert oom_kill_count(tmp_path) == 5


def test_oom_kill_count_unavailable(tmp_path: Path) -> None:
    assert oom_kill_count(tmp_path) is None  # no files
    (tmp_path / "memory.events").write_text("low 0\nhigh 0\n")  # kernel without the field
    assert oom_kill_count(tmp_path) is None
    (tmp_path / "memory.events").write_text("oom_kill lots\n")
    assert oom_kill_count(tmp_path) is None


def _fake_proc(tmp_path: Path, cgroup: str, mountinfo: str) -> tuple[Path, Path]:
    cg, mi = tmp_path / "proc-self-cgroup", tmp_path / "proc-self-mountinfo"
    cg.write_text(cgroup)
    mi.write_text(mountinfo)
    return cg, mi


def test_own_cgroup_dir_v2(tmp_path: Path) -> None:
    mount = tmp_path / "sys" / "fs" / "cgroup"
    leaf = mount / "user.slice" / "user-1000.slice" / "session-3.scope"
    leaf.mkdir(parents=True)
    (leaf / "memory.events").write_text(MEMORY_EVENTS)
    cg, mi = _fake_proc(
        tmp_path,
        "0::/user.slice/user-1000.slice/session-3.scope\n",
        f"22 27 0:21 / /proc rw,nosuid - proc proc rw\n"
        f"30 24 0:26 / {mount} rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate\n",
    )
    assert own_cgroup_dir(cgroup_file=cg, mountinfo=mi) == leaf
    assert oom_kill_count(own_cgroup_dir(cgroup_file=cg, mountinfo=mi)) == 3


def test_own_cgroup_dir_v2_mount_root_and_escapes(tmp_path: Path) -> None:
    # A container whose cgroup2 mount shows only its own subtree, at a path with a space.
    mount = tmp_path / "cg root"
    (mount / "job").mkdir(parents=True)
    (mount / "job" / "memory.events").write_text(MEMORY_EVENTS)
    escaped = str(mount).replace(" ", "\\040")
    cg, mi = _fake_proc(
        tmp_path, "0::/kubepods/pod1/job\n", f"40 31 0:38 /kubepods/pod1 {escaped} rw - cgroup2 cgroup2 rw\n"
    )
    assert own_cgroup_dir(cgroup_file=cg, mountinfo=mi) == mount / "job"


def test_own_cgroup_dir_v2_root_cgroup_has_no_counter(tmp_path: Path) -> None:
    mount = tmp_path / "fs"
    mount.mkdir()
    cg, mi = _fake_proc(tmp_path, "0::/\n", f"30 24 0:26 / {mount} rw - cgroup2 cgroup2 rw\n")
    assert own_cgroup_dir(cgroup_file=cg, mountinfo=mi) is None


def test_own_cgroup_dir_v1_hybrid(tmp_path: Path) -> None:
    unified, memory = tmp_path / "unified", tmp_path / "memory"
    unified.mkdir()
    (memory / "docker" / "abc").mkdir(parents=True)
    (memory / "docker" / "abc" / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 2\n")
    cg, mi = _fake_proc(
        tmp_path,
        "12:pids:/docker/abc\n4:memory:/docker/abc\n0::/docker/abc\n",
        f"35 31 0:32 / {memory} rw,relatime - cgroup cgroup rw,memory\n"
        f"41 31 0:38 / {unified} rw,relatime - cgroup2 cgroup2 rw\n",
    )
    found = own_cgroup_dir(cgroup_file=cg, mountinfo=mi)
    assert found == memory / "docker" / "abc"
    assert oom_kill_count(found) == 2


def test_own_cgroup_dir_unavailable(tmp_path: Path) -> None:
    assert own_cgroup_dir(cgroup_file=tmp_path / "none", mountinfo=tmp_path / "none") is None
    cg, mi = _fake_proc(tmp_path, "garbage\n0::/../../etc\n", "garbage\n")
    assert own_cgroup_dir(cgroup_file=cg, mountinfo=mi) is None


def test_real_cgroup_does_not_crash() -> None:
    found = own_cgroup_dir()
    assert found is None or found.is_dir()
    count = oom_kill_count()
    assert count is None or (isinstance(count, int) and count >= 0)


def test_tensorflow_failed_to_allocate() -> None:
    log = (
        b'  File "/srv/eager.py", line 4, in <module>\n    y = x + x\n'
        b"tensorflow.python.framework.errors_impl.ResourceExhaustedError: failed to allocate memory [Op:AddV2]\n"
    )
    assert find_gpu_oom(log) == (
        "tensorflow.python.framework.errors_impl.ResourceExhaustedError: failed to allocate memory [Op:AddV2]"
    )
    # The class name alone, repeated over a whole tail, is no evidence (and stays a linear scan).
    assert find_gpu_oom((b"ResourceExhaustedError " * 3000)[: failure.DEFAULT_TAIL_BYTES]) is None
