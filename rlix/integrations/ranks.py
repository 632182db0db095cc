"""The processes of one training script (``accelerate launch``, ``torchrun``) as one rlix job.

Rank 0 speaks for the job: it joins the scheduler and plays every rank's
rollouts. The others give it their prompts and wait for what it shares.
``torch.distributed`` carries the values (pickled, small). With one process
nothing is sent.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Ranks:
    world: int = 1
    rank: int = 0

    @property
    def main(self) -> bool:
        return self.rank == 0

    def gather(self, value) -> list:
        """Every rank's ``value``, in rank order, on every rank."""
        if self.world == 1:
            return [value]
        import torch.distributed as dist

        out = [None] * self.world
        dist.all_gather_object(out, value)
        return out

    def share(self, value):
        """Rank 0's ``value``, on every rank (what the others pass is ignored)."""
        if self.world == 1:
            return value
        import torch.distributed as dist

        box = [value]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def mine(self, parts: list, values: list) -> list:
        """This rank's slice of ``values``, which follow ``parts`` (every rank's list, in rank order) item for item."""
        start = sum(len(p) for p in parts[: self.rank])
        return values[start : start + len(parts[self.rank])]
