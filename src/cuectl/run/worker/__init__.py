"""The worker: register the host, claim frames that fit, lease devices, launch, report.

``Worker.loop()`` does one iteration (finish what ended, heartbeat, reap, claim what
fits); ``Supervisor`` is the tiny driver around it that sleeps, wakes on child exits and
signals, and decides when to stop. Keeping the iteration separate makes the worker easy to
test and to reason about: every step is a short, fenced store call.

Each concern behind the loop is a module of this package (docs/architecture.md):

- ``core``: ``Worker`` and its iteration, heartbeats, drain and stop;
- ``options``: ``WorkerOptions``, ``Inventory`` (what one discovery found);
- ``storeview``: ``WorkerStore`` (the store methods a worker calls), outage accounting,
  the reports the store has not recorded yet;
- ``dispatch``: fit, CPU room, busy devices and NIMBY, reservations and backfill, as frozen
  decisions (``Reservation``, ``DispatchState``);
- ``proofs``: whom the worker runs work for;
- ``running``: the running-frame table (launch and its caches, finish, failure evidence);
- ``sampling``: device and frame samples, live values;
- ``inventory``: registration, re-discovery;
- ``recovery``: run files, the state directory's lock, a restarted worker's clean-up;
- ``supervisor``: signals, sleep, stop; ``ExitWatch``.

Crash safety: a device is leased (a kernel lock, inherited by the frame process) before
its frame is claimed, so if the worker dies anywhere the device stays leased until the
frame's processes are gone. A restarted worker reads the run files it left in its state
directory, kills still-running orphans, and only then requeues their frames — a frame
never runs twice at once on its host. Other hosts requeue a silent worker's frames once
their lease expires (``reap``); the store's attempt fencing discards late reports.

The constants are read where they live (``dispatch.CLAIM_BATCH``, ``storeview.STORE_RETRY_MAX_S``,
``running.RUN_AS_TTL_S``, ...): patch them there, not here.
"""

from .core import LoopStats, Worker, write_heartbeat
from .dispatch import CLAIM_BATCH, RUNNABLE_PAGE, DeviceState, Dispatcher, DispatchState, Look, Reservation
from .inventory import HostInventory
from .options import Inventory, Sampler, WorkerOptions
from .proofs import Proofs
from .recovery import WORKER_LOCK, Recovery, RunFiles, WorkerAlreadyRunning, hold_state_dir
from .running import ENV_TEMPLATES_KEPT, RUN_AS_TTL_S, FrameTable, RunningFrame, proc_started
from .sampling import Sampling
from .storeview import STORE_RETRY_FIRST_S, STORE_RETRY_MAX_S, Pending, StoreView, WorkerStore
from .supervisor import ExitWatch, Supervisor

__all__ = [
    "CLAIM_BATCH",
    "ENV_TEMPLATES_KEPT",
    "RUNNABLE_PAGE",
    "RUN_AS_TTL_S",
    "STORE_RETRY_FIRST_S",
    "STORE_RETRY_MAX_S",
    "WORKER_LOCK",
    "DeviceState",
    "DispatchState",
    "Dispatcher",
    "ExitWatch",
    "FrameTable",
    "HostInventory",
    "Inventory",
    "Look",
    "LoopStats",
    "Pending",
    "Proofs",
    "Recovery",
    "Reservation",
    "RunFiles",
    "RunningFrame",
    "Sampler",
    "Sampling",
    "StoreView",
    "Supervisor",
    "Worker",
    "WorkerAlreadyRunning",
    "WorkerOptions",
    "WorkerStore",
    "hold_state_dir",
    "proc_started",
    "write_heartbeat",
]
