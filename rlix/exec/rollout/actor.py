"""Executor layer: the rollout worker actor, one process per rollout worker of a job.

Created with :func:`rlix.exec.placement.actor_options`, so the process sees only
its planned GPUs. It holds the engine (:mod:`rlix.exec.rollout.backend`); the
queue, versions and scheduling calls live in the job's coordinator.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time

import ray

from rlix.exec.device_memory import MemoryCheck
from rlix.exec.messages import (
    AdapterSnapshot,
    Emulation,
    EngineRefused,
    EngineStopped,
    GenRequest,
    GenResult,
    LoraSpec,
    SwitchTiming,
    VllmOptions,
    WorkerFault,
)
from rlix.exec.placement import require_readable, setup_process
from rlix.exec.rollout.torch_backend import make_backend
from rlix.weightsync.types import DeviceHandoff, WeightBuckets

CONTROL_THREADS = 8  # threads beyond the slots: wake, sleep, weight and adapter syncs never queue behind generation


def worker_concurrency(slots_per_worker: int) -> int:
    """The worker actor's threads for a job: one per generation slot, plus :data:`CONTROL_THREADS`."""
    return slots_per_worker + CONTROL_THREADS


@ray.remote(max_concurrency=worker_concurrency(64))  # the default; a job's coordinator sets its own (worker_options)
class RolloutWorkerActor:
    """One rollout worker (a TP-sized GPU bundle) of one pipeline."""

    def __init__(
        self,
        emulation: Emulation,
        lora: LoraSpec | None = None,
        backend: str = "torch",
        vllm: VllmOptions = VllmOptions(),
        fault: WorkerFault = WorkerFault(),
    ) -> None:
        self.visible = setup_process()
        self.fault = fault
        self._dying = False
        # The bundle placement pinned this process to (logical ids on a CPU host): a vLLM engine spans it.
        devices = tuple(int(g) for g in self.visible.split(",") if g.strip()) or (0,)
        self.backend = make_backend(backend, emulation, lora, vllm, devices)
        self.memory: MemoryCheck | None = None  # free memory on the first device, checked before every wake

    def prepare(self, model_path: str) -> float:
        """Start-up that needs no GPU (imports, config): done at the job's init."""
        from rlix.exec.placement import device_for_worker

        require_readable(model_path, "model directory")
        t0 = time.perf_counter()
        self.memory = MemoryCheck(device_for_worker())
        self.backend.prepare(model_path, self.memory.device)
        return time.perf_counter() - t0

    def wake(
        self, snapshot: WeightBuckets | None, *adapters: AdapterSnapshot, handoff: DeviceHandoff | None = None
    ) -> SwitchTiming:
        """Resume with ``snapshot`` (the trainer's published full weights, or the base) and every current
        adapter; the timing's ``synced_bytes`` are the bytes of the weights it loaded. ``handoff``: the
        snapshot's buckets on the trainer's GPU, while the trainer keeps them (:mod:`rlix.weightsync.handoff`)."""
        if self.fault.hang_wake:
            threading.Event().wait()  # injected: a wake that never returns (the caller's deadline kills us)
        t0 = time.perf_counter()
        snapshot = _handed_off(snapshot, handoff)
        loads = self.backend.full_loads
        had = self.backend.adapter_versions if self.backend.awake else {}
        cold = self.backend.builds_on_wake
        self.memory.wait_for("wake")  # what the first wake took must be free (NotEnoughMemoryError: reported lost)
        self.memory.measure("wake", lambda: self.backend.wake(snapshot, adapters))
        full = self.backend.full_loads > loads  # an engine that kept its weights asleep (vLLM level 1) loads none
        synced = snapshot.nbytes if full else 0
        synced += sum(a.nbytes for a in adapters if a.version > had.get(a.name, -1))
        return self._timing(t0, synced, cold, full)

    def _timing(self, t0: float, synced: int, cold: bool = False, full: bool = False) -> SwitchTiming:
        """The switch since ``t0``; ``full``: it loaded the full weights (their route is named)."""
        versions = tuple(sorted(self.backend.adapter_versions.items()))
        route = self.backend.route if full else None
        return SwitchTiming(
            seconds=time.perf_counter() - t0,
            synced_bytes=synced,
            version=self.backend.weight_version,
            adapters=versions,
            cold=cold,
            sync_path=route.path if route is not None else None,
        )

    def update_adapter(self, snapshot: AdapterSnapshot) -> SwitchTiming:
        t0 = time.perf_counter()
        if not self.backend.awake or snapshot.version <= self.backend.adapter_versions.get(snapshot.name, -1):
            return self._timing(t0, 0)
        self.backend.update_adapter(snapshot)
        return self._timing(t0, snapshot.nbytes)

    def sleep(self) -> SwitchTiming:
        t0 = time.perf_counter()
        if self.memory is not None:  # what the sleep frees is what the next wake needs (not the first wake's build)
            self.memory.measure_freed("wake", self.backend.sleep)
        else:
            self.backend.sleep()
        return SwitchTiming(seconds=time.perf_counter() - t0)

    def update_weights(self, snapshot: WeightBuckets, handoff: DeviceHandoff | None = None) -> SwitchTiming:
        t0 = time.perf_counter()
        snapshot = _handed_off(snapshot, handoff)
        if not self.backend.awake or snapshot.version <= self.backend.weight_version:
            return SwitchTiming(seconds=0.0, version=self.backend.weight_version)
        self.backend.update_weights(snapshot)
        return self._timing(t0, snapshot.nbytes, full=True)

    def generate(self, request: GenRequest) -> GenResult:
        if self.fault.refuse_requests:
            raise EngineRefused(f"engine refused trajectory {request.traj_id} (fault.refuse_requests)")
        if self.fault.die_in_rollout and not self._dying:
            self._dying = True  # injected: the process exits mid-rollout, as a crashed engine would
            threading.Timer(1.0, os._exit, (1,)).start()
        try:
            return self.backend.generate(request)
        except EngineStopped:  # a broken engine serves nothing more: die, so the job continues on other workers
            os._exit(1)

    def visible_devices(self) -> str:
        return self.visible


def _handed_off(snapshot: WeightBuckets | None, handoff: DeviceHandoff | None) -> WeightBuckets | None:
    """The published buckets with the handles to their copy on the trainer's GPU, where it still keeps one."""
    return snapshot if snapshot is None or handoff is None else dataclasses.replace(snapshot, handoff=handoff)
