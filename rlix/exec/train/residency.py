"""Executor layer: where a learner's parts live (its device or the host), and every move between them.

A learner holds its GPUs only while a stage is granted. Each stage moves onto
the device only the parts it uses (:data:`STAGE_PARTS`: old log-probs the
policy, reference log-probs the reference, training the policy and the
optimizer state); a stage method that finds a part it uses still on the host
moves it then. Offload moves back whatever is on the device and then returns
the caching allocator's memory (:func:`release_cached_memory`), so the GPU is
free for the next holder (a waking vLLM engine checks for free memory, not
for memory PyTorch merely keeps cached). Before parts move onto the device,
its free memory is checked against their bytes (as they last moved), with a
short wait for a previous holder to let go
(:class:`rlix.exec.device_memory.MemoryCheck`): a shortfall is one clear
error, not an out-of-memory crash halfway through a stage. Every move goes
through :meth:`Residency.place`, which records it (:class:`Move`).

A part moves through the learner's :class:`~rlix.exec.train.host_arena.HostArena`:
host buffers allocated once and reused, page-locked on a CUDA host, one copy per
part each way. A part sharded by FSDP2 (DTensor parameters, whose storage FSDP2
manages) moves with ``.to()`` through pageable memory instead; its moves say so.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from rlix.core import Stage
from rlix.exec.device_memory import MemoryCheck
from rlix.exec.messages import LearnerPart
from rlix.exec.train.host_arena import HostArena, module_handles, optimizer_handles, plain

HOST = "cpu"
ALL_PARTS = tuple(LearnerPart)
# What each of the trainer's stages computes with (training reads the reference's
# log-probs from its samples: the reference model itself stays on the host).
STAGE_PARTS: dict[Stage, tuple[LearnerPart, ...]] = {
    Stage.OLD_LOGPROBS: (LearnerPart.POLICY,),
    Stage.REF_LOGPROBS: (LearnerPart.REFERENCE,),
    Stage.ACTOR_TRAIN: (LearnerPart.POLICY, LearnerPart.OPTIMIZER),
}


@dataclass(frozen=True, kw_only=True)
class Move:
    """One part (``name``: the adapter of a LoRA optimizer, else "") moved onto the learner's device or
    to the host; bytes of its tensors; ``pinned``: through page-locked host memory (else pageable)."""

    part: LearnerPart
    name: str
    onto_device: bool
    nbytes: int
    pinned: bool = False


def release_cached_memory(device: str) -> bool:
    """Give the caching allocator's unused blocks on ``device`` back to the driver; True if it had any to give
    (a CUDA device), False on a CPU (whose allocator returns freed memory itself)."""
    import torch

    if not str(device).startswith("cuda") or not torch.cuda.is_available():
        return False
    torch.cuda.synchronize()  # copies to the host still in flight hold their blocks until they finish
    torch.cuda.empty_cache()
    return True


def optimizer_to(opt, device: str) -> int:
    """Move ``opt``'s state tensors to ``device`` (the step counts stay where the optimizer keeps them); bytes moved."""
    moved = 0
    for h in optimizer_handles(opt):
        t = h.get()
        h.set(t.to(device))
        moved += t.numel() * t.element_size()
    return moved


def _grads_to(module, device: str) -> None:
    """Gradients a step left (none normally: training ends with ``zero_grad(set_to_none=True)``; one that
    failed may leave some) move with their parameters, as ``module.to()`` moves them."""
    for p in module.parameters():
        if p.grad is not None:
            p.grad = p.grad.to(device)


def module_to(module, device: str) -> int:
    module.to(device)
    return sum(t.numel() * t.element_size() for t in module.state_dict().values())


class Residency:
    """The parts of one learner (modules and optimizers, by :class:`LearnerPart` and name) and where each is."""

    def __init__(self, device: str, memory: MemoryCheck | None = None) -> None:
        self.device = device
        self.memory = memory or MemoryCheck(device)  # free device memory, checked before parts move onto it
        self._parts: dict[tuple[LearnerPart, str], object] = {}
        self._on_device: dict[tuple[LearnerPart, str], bool] = {}
        self._nbytes: dict[tuple[LearnerPart, str], int] = {}  # each part's bytes, as it last moved
        self.arena = HostArena(device)  # the parts' host buffers, reused by every offload
        self.moves: list[Move] = []  # every move, in order
        self.releases = 0  # offloads that returned cached device memory

    def add(self, part: LearnerPart, obj, name: str = "") -> None:
        """Track ``obj`` (a module, or an optimizer when ``part`` is OPTIMIZER); it starts on the device."""
        self._parts[(part, name)] = obj
        self._on_device[(part, name)] = True

    def tracked(self) -> dict[tuple[LearnerPart, str], object]:
        """Every tracked part (a module, or an optimizer) by (part, name)."""
        return dict(self._parts)

    def on_device(self, part: LearnerPart, name: str = "") -> bool:
        return self._on_device[(part, name)]

    def need(self, parts: Iterable[LearnerPart], names: Iterable[str] | None = None) -> None:
        """Every tracked key of ``parts`` (only those named ``names``, if given) on the device."""
        parts, wanted = set(parts), None if names is None else set(names)
        keys = [k for k in self._parts if k[0] in parts and (wanted is None or k[1] in wanted) and not self._on_device[k]]
        if keys:
            what = "moving " + ", ".join(sorted({f"{p.value} {n}".strip() for p, n in keys})) + " onto the device"
            self.memory.wait_for(what, sum(self._nbytes.get(k, 0) for k in keys))
        for part, name in keys:
            self.place(part, name, onto_device=True)

    def offload(self) -> None:
        """Everything on the device to the host, then the device's cached memory back to the driver."""
        for part, name in list(self._parts):
            if self._on_device[(part, name)]:
                self.place(part, name, onto_device=False)
        if release_cached_memory(self.device):
            self.releases += 1

    def place(self, part: LearnerPart, name: str, *, onto_device: bool) -> None:
        """The one place a part moves: onto this learner's device, or to the host; recorded.

        (A CPU learner's parts move from the CPU to the CPU: through the same host buffers and copies
        as on a GPU, in plain memory, which is how the rules and the copies are tested.)"""
        key = (part, name)
        obj = self._parts[key]
        handles = optimizer_handles(obj) if part is LearnerPart.OPTIMIZER else module_handles(obj)
        if plain(handles):
            nbytes = self.arena.to_device(key, handles) if onto_device else self.arena.to_host(key, handles)
            pinned = self.arena.is_pinned(key)
            if part is not LearnerPart.OPTIMIZER:  # after the parameters: a gradient goes where its parameter is
                _grads_to(obj, self.device if onto_device else HOST)
        else:  # FSDP2 shards: FSDP2 keeps their storage, so they move with .to()
            device = self.device if onto_device else HOST
            nbytes = optimizer_to(obj, device) if part is LearnerPart.OPTIMIZER else module_to(obj, device)
            pinned = False
        self._on_device[key] = onto_device
        self._nbytes[key] = nbytes
        self.moves.append(Move(part=part, name=name, onto_device=onto_device, nbytes=nbytes, pinned=pinned))
