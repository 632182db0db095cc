"""Weight sync as a library: a trainer publishes each version once, rollout engines load it.

What rlix's executor uses between its trainer and rollout workers, importable
without it (nothing here imports ``rlix.exec``, Ray, or torch until a call
needs it), for a pipeline of your own, a TRL script, or another framework::

    from rlix.weightsync import publish_of, load_into, device_tensors

    # trainer side, once per version: flat buckets in the engine's dtype and an index
    weights = publish_of(model, version, "bfloat16")   # every rank calls it under FSDP2
    ref = ray.put(weights)                              # or return it from the trainer actor

    # engine side: into an HF/torch model in place (the path taken is returned) ...
    route = load_into(engine_model, ray.get(ref), "cuda:0")
    # ... or as (name, tensor) pairs for an engine's own loader (vLLM's reload_weights)
    for name, tensor in device_tensors(ray.get(ref), "cuda:0"):
        ...

- :mod:`rlix.weightsync.buckets`: publishing (:func:`publish_of`), loading
  (:func:`load_into`, :func:`device_tensors`, :func:`views`), the pinned
  staging of a GPU load (:class:`PinnedStaging`), the path's choice (:func:`route_to`).
- :mod:`rlix.weightsync.host_pages`: the object store's pages page-locked in place.
- :mod:`rlix.weightsync.handoff`: a version read in place over CUDA IPC on the
  trainer's own GPU.
- :mod:`rlix.weightsync.lora_merged`: a PEFT LoRA model published as its base
  model's merged weights (``publish_of(MergedLora(peft_model), ...)``).
- :mod:`rlix.weightsync.types`: the values (plain dataclasses; numpy buffers).
"""

from rlix.weightsync.buckets import PinnedStaging, device_tensors, load_into, publish_of, route_to, snapshot_of, views
from rlix.weightsync.handoff import Route
from rlix.weightsync.lora_merged import MergedLora
from rlix.weightsync.types import DeviceHandoff, SyncPath, TensorSlot, WeightBuckets, WeightSnapshot

__all__ = [
    "DeviceHandoff",
    "MergedLora",
    "PinnedStaging",
    "Route",
    "SyncPath",
    "TensorSlot",
    "WeightBuckets",
    "WeightSnapshot",
    "device_tensors",
    "load_into",
    "publish_of",
    "route_to",
    "snapshot_of",
    "views",
]
