"""Several processes, one LLM fine-tune or evaluation, on PyTorch's own distributed engine.

    torchrun --nproc_per_node 4 train.py --llm smollm2 --method ryarn --batch 2 --device cuda          # DDP
    torchrun --nproc_per_node 8 train.py --llm DIR --method ryarn --fsdp --device cuda                   # FSDP2
    torchrun --nproc_per_node 2 eval.py runs/llm-ryarn-s0 --lengths 8192,16384                          # sharded

A launcher (torchrun, or any that sets the same environment) starts one process per device and tells each its
place through the environment: RANK, WORLD_SIZE, LOCAL_RANK (the device on its node), MASTER_ADDR and
MASTER_PORT. Without a launcher there is one process and everything here does nothing, so the one-process path
is the code path every run takes. The backend is NCCL on CUDA and gloo on the CPU, where the tests run.

Two ways to spread a fine-tune (train.py --llm):
- DDP (the default under a launcher): every process holds the whole model and the optimizer state, and the
  gradients are averaged across processes after each backward. For LoRA, or any model that fits one device.
- FSDP2 (--fsdp): torch.distributed.fsdp.fully_shard on each decoder layer, then on the whole model; every
  process holds 1/N of the parameters, gradients and optimizer state and gathers a layer's weights only while
  it runs. For full fine-tuning of a model that does not fit one device.
Either way the gradients are averaged over processes, so a rank divides its loss by the samples it sees.
"""
from __future__ import annotations

import contextlib
import os

import torch
import torch.distributed as dist

from runs import UsageError, launch_rank  # noqa: F401  (dist.launch_rank: the rank before start)


def launched() -> bool:
    """Started by a launcher with more than one process."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def start(device: str) -> str:
    """Join the process group when a launcher started this process; returns the device this process uses
    (cuda becomes cuda:LOCAL_RANK: one device per process)."""
    if not launched() or dist.is_initialized():
        return device
    if torch.device(device).type == "cuda":
        local = int(os.environ.get("LOCAL_RANK", "0"))
        if local >= torch.cuda.device_count():
            raise UsageError(f"process {local} on this node has no GPU of its own ({torch.cuda.device_count()} "
                             "here): start at most that many with torchrun --nproc_per_node")
        device = f"cuda:{local}"
        torch.cuda.set_device(device)
        dist.init_process_group("nccl")
    elif torch.device(device).type == "cpu":
        dist.init_process_group("gloo")
    else:
        raise UsageError(f"--device {device}: several processes run on cuda (NCCL) or cpu (gloo)")
    return device


def stop() -> None:
    """Leave the process group together: a process that tears down its connections while another still
    uses them can abort that one (seen with gloo)."""
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def world() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def wrap(model: torch.nn.Module, fsdp: bool, device: str) -> torch.nn.Module:
    """The model as the processes train it together: FSDP2 shards (each decoder layer a unit of its own, so
    that only one layer's full weights exist at a time, then the rest: embeddings, final norm, head), DDP
    replicas, or, alone, the model itself."""
    if fsdp:
        from torch.distributed.fsdp import fully_shard
        for layer in model.get_decoder().layers:
            fully_shard(layer)
        return fully_shard(model)
    if world() == 1:
        return model
    index = torch.device(device).index
    return torch.nn.parallel.DistributedDataParallel(model, device_ids=None if index is None else [index])


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The model inside a DDP wrapper (FSDP2 changes the model in place: it has no wrapper)."""
    return model.module if isinstance(model, torch.nn.parallel.DistributedDataParallel) else model


@contextlib.contextmanager
def gradient_sync(model: torch.nn.Module, sync: bool):
    """Let the backward in this block average gradients across processes, or (sync False) only accumulate
    them here: a step with several backwards communicates once, in its last."""
    if sync or world() == 1:
        yield
    elif isinstance(model, torch.nn.parallel.DistributedDataParallel):
        with model.no_sync():
            yield
    else:  # FSDP2
        model.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            model.set_requires_gradient_sync(True)


def total(values: list[float], op: str = "sum") -> list[float]:
    """Element-wise sum or max of `values` over all processes."""
    if world() == 1:
        return values
    t = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(t, dist.ReduceOp.SUM if op == "sum" else dist.ReduceOp.MAX)
    return t.tolist()


def local(tensor: torch.Tensor) -> torch.Tensor:
    """A plain tensor for what FSDP2 computes as a DTensor (e.g. the gradient norm over every shard)."""
    return tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor


def gather(items: list) -> list:
    """Every process's `items`, concatenated in rank order, on every process."""
    if world() == 1:
        return items
    everyone = [None] * world()
    dist.all_gather_object(everyone, items)
    return [item for part in everyone for item in part]


def full_state(model: torch.nn.Module) -> dict:
    """The whole model's state dict, in CPU memory, on rank 0 (other ranks get an empty dict): under FSDP2
    gathered from the shards, one tensor at a time, by every process together."""
    from torch.distributed.fsdp import FSDPModule
    if not isinstance(model, FSDPModule):
        return unwrap(model).state_dict() if rank() == 0 else {}
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
