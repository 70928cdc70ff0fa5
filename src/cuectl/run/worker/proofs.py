"""Whom the worker runs work for: the users it agreed to run (``--allow-user``), the tags it
has, and (a root worker, which runs each frame as its submitter) proof that the job's user
really submitted it (sched/identity.py): a label alone never makes anyone root."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from cuectl.sched import identity
from cuectl.sched.match import tags_fit
from cuectl.sched.store import ClaimedFrame, RunnableLayer

from .options import WorkerOptions
from .storeview import WorkerStore


@dataclass
class Proofs:
    """The proofs checked so far, keyed by everything they depend on (a row changed since is
    checked afresh), so the dispatch path reads each receipt once, not per frame; and the
    jobs whose submitter could not be proven (job id -> why: never run)."""

    store: WorkerStore
    options: Callable[[], WorkerOptions]  # the worker's options as they are now
    warn: Callable[[str], None]
    unproven: dict[int, str] = field(default_factory=dict)
    proven: set[tuple[Any, ...]] = field(default_factory=set)

    def accepts(self, layer: RunnableLayer) -> bool:
        """Tags, the users whose work this worker agreed to run, and (a root worker) proof
        that the job's user really submitted it."""
        opts = self.options()
        if opts.allowed_users and layer.user not in opts.allowed_users:
            return False
        if opts.run_as_submitter and self.problem(layer):
            return False
        return tags_fit(layer.tags, opts.tags)

    def check_layer(self, claim: ClaimedFrame) -> None:
        """Raise ``Unproven`` unless this layer is what its user submitted (read once per
        distinct layer content: every field the receipt's digest covers is in the key, so
        a row changed since is checked afresh; the digest itself, a hash of its JSON, is
        computed only then)."""
        key = (
            claim.job_id,
            claim.user,
            claim.submitted_by,
            claim.receipt,
            claim.layer,
            claim.command,
            tuple(sorted(claim.env.items())),
            claim.layer_range,
            claim.chunk,
            claim.cwd,
            claim.job,
            claim.show,
            claim.shot,
        )
        if key in self.proven:
            return
        # The frame's tokens and CUE_* values are made of this claim's fields: once they
        # match the receipt, the worker runs what its user submitted (a job renamed in
        # the store to `$(...)` is refused, never expanded into `sh -c '... #JOB#'`).
        identity.check_layer(
            user=claim.user,
            job_id=claim.job_id,
            layer=claim.layer,
            command=claim.command,
            env=claim.env,
            frame_range=claim.layer_range,
            chunk=claim.chunk,
            submitted_by=claim.submitted_by,
            receipt=claim.receipt,
            spool=self.store.receipt_dir,
            cwd=claim.cwd,
            job_name=claim.job,
            show=claim.show,
            shot=claim.shot,
        )
        self.proven.add(key)

    def problem(self, layer: RunnableLayer) -> str | None:
        """Why the layer's job is not proven its user's (None: it is)."""
        key = (layer.job_id, layer.user, layer.submitted_by, layer.receipt)
        if key in self.proven:
            return None
        if layer.job_id not in self.unproven:
            problem = identity.proof_problem(
                user=layer.user,
                job_id=layer.job_id,
                submitted_by=layer.submitted_by,
                receipt=layer.receipt,
                spool=self.store.receipt_dir,
            )
            if problem is None:
                self.proven.add(key)  # the layer's digest is checked again at launch
                return None
            self.unproven[layer.job_id] = problem
            self.warn(f"not running job {layer.job_id} ({layer.job}) as {layer.user}: {problem}")
        return self.unproven[layer.job_id]
