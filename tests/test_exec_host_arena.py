"""A learner's host buffers (rlix.exec.train.host_arena) on small torch modules, in process: what moves,
what every name of a tensor sees after a move, and what comes back when a part was replaced on the host.
(The learner's own round trip, bit for bit with the buffers reused, is in tests/test_exec_trainer.py.)"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from rlix.exec.messages import LearnerPart  # noqa: E402
from rlix.exec.train.host_arena import HostArena, module_handles, optimizer_handles  # noqa: E402
from rlix.exec.train.residency import Residency  # noqa: E402


def _module():
    m = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    shared = torch.arange(5, dtype=torch.float64)
    m[0].register_buffer("freq", shared)  # one tensor, two names (as transformers' RoPE keeps its original)
    m[0].register_buffer("original_freq", shared, persistent=False)
    m[1].register_buffer("count", torch.tensor(7, dtype=torch.int64))  # a 0-dim integer buffer
    return m


def test_a_module_moves_once_per_tensor_and_every_name_follows():
    m, arena = _module(), HostArena("cpu")
    before = {k: v.clone() for k, v in m.state_dict().items()}
    handles = module_handles(m)
    assert len(handles) == 4 + 2  # two weights, two biases; the shared buffer once, the count
    arena.to_host("policy", handles)
    host = arena._regions["policy"].host
    start, end = host.data_ptr(), host.data_ptr() + host.numel()
    for t in [*m.parameters(), *m.buffers()]:
        assert start <= t.data_ptr() < end  # in the host buffer
    assert m[0].freq is m[0].original_freq  # both names see the one moved tensor
    arena.to_device("policy", module_handles(m))
    assert m[0].freq is m[0].original_freq and not start <= m[0].freq.data_ptr() < end
    assert all(torch.equal(before[k], v) for k, v in m.state_dict().items())


def test_a_part_replaced_while_on_the_host_comes_back_as_replaced():
    m, arena = _module(), HostArena("cpu")
    arena.to_host("policy", module_handles(m))
    fresh = {k: torch.full_like(v, 3) for k, v in m.state_dict().items()}
    m.load_state_dict(fresh, assign=True)  # new tensors, outside the host buffer
    arena.to_device("policy", module_handles(m))
    assert all(torch.equal(fresh[k], v) for k, v in m.state_dict().items())  # not the buffer's stale bytes
    assert arena.host_bytes() == 0  # the buffer no longer holds the part: let go


def test_gradients_and_optimizer_state_move_with_their_part():
    m = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(m.parameters(), lr=0.1)
    m(torch.ones(1, 3)).sum().backward()
    opt.step()
    grads = [p.grad.clone() for p in m.parameters()]
    state = [t.clone() for h in optimizer_handles(opt) for t in [h.get()]]
    res = Residency("cpu")
    res.add(LearnerPart.POLICY, m)
    res.add(LearnerPart.OPTIMIZER, opt)
    res.offload()
    res.need([LearnerPart.POLICY, LearnerPart.OPTIMIZER])
    assert all(torch.equal(a, p.grad) for a, p in zip(grads, m.parameters(), strict=True))
    assert all(torch.equal(a, h.get()) for a, h in zip(state, optimizer_handles(opt), strict=True))
    assert [m.onto_device for m in res.moves] == [False, False, True, True] and not any(m.pinned for m in res.moves)
    assert res.arena.allocations == 2
