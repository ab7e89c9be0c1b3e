"""Data parallelism on torch.distributed: the process group of a run, for every stage.

    torchrun --nproc_per_node K -m hydrappo train CONFIG
    accelerate launch --num_processes K -m hydrappo train CONFIG

A launcher starts K copies of the command with RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and
MASTER_PORT in their environment; the harness reads them (`ProcessGroup.from_environment`),
starts the process group (NCCL for CUDA tensors plus gloo for small CPU ones; gloo alone on
the CPU) and puts each process on its own device, cuda:LOCAL_RANK. Without a launcher there is
one process, no group, and none of this runs.

Every process holds the whole frozen trunk and works on its own share of each batch. Only the
GRADIENTS OF THE TRAINABLE PARAMETERS (top-N layers, heads, adapters, a reward branch) travel:
one SUM all-reduce of them per optimizer step (`reduce_gradients`), in buckets, with a flag in
the same buffer that says whether some process had a non-finite loss, so that every process
skips or takes the same step. Not DDP, because:
  - DDP reduces from backward hooks armed by `module.forward()`; the hydra's trainable parts
    are reached through forward_top / reward_scores / generate, not through one forward;
  - a process that skips a backward (a non-finite loss, an empty share of a stage's last
    batch) would leave DDP's reducer waiting for it: a hang. One explicit all-reduce at the
    optimizer step meets every process at the same place, once per update, whatever it did;
  - the losses are already divided by the GLOBAL token (or row) count of their minibatch, so
    the gradients must be summed, not averaged;
  - DDP's one advantage, overlapping communication with the backward pass, buys little when
    only the top N layers reduce.

A failure on one process (a reward function that raises, a bad batch, a full disk on the
process that writes) must stop them all with its message, not leave the others waiting in a
collective. Work that can fail runs inside `phase(...)`, which holds no collective; at its end
every process all-reduces a failure flag, and if any failed they all raise, each process that
did not fail naming the one that did and its message (`DistributedError`). A process that dies
or hangs outside a phase is caught by the group's timeout (`train.dist_timeout_s`).

A trunk too large for one device can be sharded with FSDP2 (`shard_frozen_trunk`,
`train.fsdp_trunk`): its frozen layers then hold collectives of their own.
"""

from __future__ import annotations

import datetime
import io
import logging
import os
from contextlib import contextmanager

import torch

from ..errors import HydrappoError, UsageError

logger = logging.getLogger("hydrappo")

BUCKET_ELEMENTS = 25 * 2**20  # gradients are reduced in float32 buckets of at most 100 MiB


class DistributedError(HydrappoError):
    """Another process of the run failed (its message is in this one), or stopped answering."""


def _describe(error: BaseException) -> str:
    return str(error) if isinstance(error, HydrappoError) else f"{type(error).__name__}: {error}"


def _stopped_answering(what: str, error: BaseException) -> DistributedError:
    return DistributedError(
        f"another process stopped answering while {what} (it died, or hung past train.dist_timeout_s); its own "
        f"output says why. ({str(error).splitlines()[0] if str(error) else type(error).__name__})"
    )


@contextmanager
def _collective(what: str):
    """A collective whose peer died or hung raises the backend's RuntimeError: say so plainly."""
    try:
        yield
    except RuntimeError as error:
        raise _stopped_answering(what, error) from None


class ProcessGroup:
    """This process's place in the run: rank, world size, and the collectives hydrappo uses.
    With world_size 1 every method is the identity and nothing is communicated."""

    def __init__(self, rank: int = 0, world_size: int = 1, local_rank: int = 0):
        self.rank, self.world_size, self.local_rank = rank, world_size, local_rank

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        """Process 0 writes the checkpoints, the logs and the progress bar."""
        return self.rank == 0

    def __repr__(self) -> str:
        return f"process {self.rank} of {self.world_size}"

    # ------------------------------------------------------------------ start
    @classmethod
    def from_environment(cls, device_option: str, timeout_s: float) -> tuple[ProcessGroup, torch.device]:
        """The group a launcher described in the environment (started here, or reused when this
        process already has one), and this process's device."""
        import torch.distributed as dist

        from ..storage.models import pick_device

        world_size = int(os.environ.get("WORLD_SIZE", "1") or 1)
        if world_size <= 1:
            return cls(), pick_device(device_option)
        rank, local_rank = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", os.environ["RANK"]))
        device = _process_device(device_option, local_rank)
        if device.type == "cuda":
            torch.cuda.set_device(device)
        if not dist.is_initialized():
            backend = "cpu:gloo,cuda:nccl" if device.type == "cuda" else "gloo"
            dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout_s))
        if dist.get_world_size() != world_size or dist.get_rank() != rank:
            raise UsageError(
                f"this process already belongs to a process group of {dist.get_world_size()} (rank {dist.get_rank()}), "
                f"but the environment says WORLD_SIZE={world_size}, RANK={rank}."
            )
        group = cls(rank, world_size, local_rank)
        if group.is_main:
            logger.info("torch.distributed: %d processes (%s), this one on %s", world_size, dist.get_backend(), device)
        return group, device

    # ------------------------------------------------------------------ failures
    @contextmanager
    def phase(self, what: str, enabled: bool = True):
        """Run local work (no collective inside!) that may fail; afterwards every process knows
        whether any failed, and if one did they all stop: the failed one with its own error,
        the others with a DistributedError naming it. `enabled=False`: no agreement (the work
        holds collectives of its own)."""
        if not (self.enabled and enabled):
            yield
            return
        try:
            yield
        except Exception as error:
            self._agree(what, error)
            raise
        self._agree(what, None)

    def _agree(self, what: str, error: BaseException | None) -> None:
        import torch.distributed as dist

        flag = torch.tensor([0.0 if error is None else 1.0])
        try:
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            if flag.item() == 0:
                return
            messages = [None] * self.world_size
            dist.all_gather_object(messages, None if error is None else _describe(error))
        except RuntimeError as backend_error:
            if error is not None:
                return  # this process's own error is the one to report
            raise _stopped_answering(what, backend_error) from None
        if error is None:
            rank, message = next((r, m) for r, m in enumerate(messages) if m is not None)
            raise DistributedError(f"process {rank} of {self.world_size} failed while {what}: {message}")

    # ------------------------------------------------------------------ collectives
    def gather_objects(self, value) -> list:
        """[value of process 0, value of process 1, ...] on every process: small values made of
        tensors, numbers, strings, lists, tuples and dicts (serialised with torch.save and read
        back with weights_only=True: torch's own object pickling cannot carry RNG-state tensors)."""
        if not self.enabled:
            return [value]
        import torch.distributed as dist

        buffer = io.BytesIO()
        torch.save(value, buffer)
        out = [None] * self.world_size
        with _collective("exchanging small values"):
            dist.all_gather_object(out, buffer.getvalue())
        return [torch.load(io.BytesIO(data), weights_only=True) for data in out]

    def broadcast_object(self, value):
        """Process 0's `value`, on every process."""
        if not self.enabled:
            return value
        import torch.distributed as dist

        box = [value]
        with _collective("receiving process 0's values"):
            dist.broadcast_object_list(box, src=0)
        return box[0]

    def gather_rows(self, tensor: torch.Tensor | None, pad_value: float = 0.0) -> torch.Tensor | None:
        """The (B, ...) concatenation, in rank order, of every process's (B / K, ...) `tensor`; a
        second dimension of different widths is right-padded with `pad_value` to the widest."""
        if not self.enabled or tensor is None:
            return tensor
        import torch.distributed as dist

        shapes = self.gather_objects(tuple(tensor.shape))
        if len({shape[0] for shape in shapes}) != 1:
            raise ValueError(f"gather_rows needs the same number of rows on every process, got {shapes}")
        if tensor.dim() >= 2:
            width = max(shape[1] for shape in shapes)
            if width > tensor.shape[1]:
                pad = tensor.new_full((tensor.shape[0], width - tensor.shape[1], *tensor.shape[2:]), pad_value)
                tensor = torch.cat([tensor, pad], dim=1)
        parts = [torch.empty_like(tensor) for _ in range(self.world_size)]
        with _collective("gathering the batch"):
            dist.all_gather(parts, tensor.contiguous())
        return torch.cat(parts)

    def largest(self, value: int, what: str) -> int:
        """The largest of every process's integer `value`, on every process (one tiny all-reduce):
        how the processes agree on a decision that reached each at its own time (a stop signal)."""
        if not self.enabled:
            return value
        import torch.distributed as dist

        box = torch.tensor([float(value)])
        with _collective(what):
            dist.all_reduce(box, op=dist.ReduceOp.MAX)
        return int(box.item())

    def shard(self, items: list) -> list:
        """This process's contiguous share of a global batch (shares differ by at most one item)."""
        n, k, r = len(items), self.world_size, self.rank
        return items[r * n // k : (r + 1) * n // k]

    def map_in_order(self, fn, batches: list, what: str) -> list:
        """[fn(batch) for batch in batches], the batches dealt round-robin to the processes (as
        the phase `what`) and the small results (see gather_objects) gathered back in order on
        every process. Each batch is computed exactly as one process would compute it, so the
        result does not depend on the number of processes."""
        with self.phase(what):
            mine = {i: fn(batch) for i, batch in enumerate(batches) if i % self.world_size == self.rank}
        if not self.enabled:
            return [mine[i] for i in range(len(batches))]
        merged: dict = {}
        for part in self.gather_objects(mine):
            merged.update(part)
        return [merged[i] for i in range(len(batches))]

    def broadcast_parameters(self, params: list[torch.nn.Parameter]) -> None:
        """Process 0's values of `params` everywhere: every process starts from the same weights."""
        if not self.enabled:
            return
        import torch.distributed as dist

        with torch.no_grad(), _collective("receiving process 0's weights"):
            for param in params:
                dist.broadcast(param.data, src=0)

    def reduce_gradients(self, params: list[torch.nn.Parameter], finite: bool) -> bool:
        """Sum the gradients of `params` over the processes (a missing gradient counts as 0), in
        float32 buckets (float64 for float64 weights); returns whether EVERY process's loss was finite. The losses are already
        divided by the global count, hence a sum. A parameter without a gradient on EVERY process
        keeps none, as on one process (the optimizer then skips it, e.g. the policy while the
        critic warms up). The finite flag and which processes hold a gradient of each parameter
        ride in the first bucket."""
        if not self.enabled:
            return finite
        import torch.distributed as dist

        device = params[0].device if params else torch.device("cpu")
        # float32 buckets, float64 ones when the weights are float64 (exact comparisons).
        dtype = torch.float64 if any(p.dtype == torch.float64 for p in params) else torch.float32
        flags = torch.tensor(
            [0.0 if finite else 1.0] + [float(p.grad is not None) for p in params], device=device, dtype=dtype
        )
        buckets, bucket, size = [], [], 0
        for param in params:
            if bucket and size + param.numel() > BUCKET_ELEMENTS:
                buckets.append(bucket)
                bucket, size = [], 0
            bucket.append(param)
            size += param.numel()
        buckets.append(bucket)
        for index, bucket in enumerate(buckets):
            parts = [
                p.grad.detach().reshape(-1).to(dtype)
                if p.grad is not None
                else torch.zeros(p.numel(), device=device, dtype=dtype)
                for p in bucket
            ]
            if index == 0:
                parts.insert(0, flags)
            flat = torch.cat(parts)
            with _collective("summing the gradients"):
                dist.all_reduce(flat)
            if index == 0:  # per parameter: how many processes hold a gradient
                all_finite = flat[0].item() == 0
                held = iter(flat[1 : len(flags)].tolist())
                flat = flat[len(flags) :]
            offset = 0
            for param in bucket:
                values = flat[offset : offset + param.numel()].view_as(param)
                offset += param.numel()
                if next(held) == 0:
                    continue  # no process computed one
                if param.grad is None:
                    param.grad = values.to(param.dtype).clone()
                else:
                    param.grad.copy_(values)
        return all_finite


def end_process_group(succeeded: bool, timeout_s: float = 120.0) -> None:
    """Take this process's group down when a command ends (the command line calls this last).

    After a run that succeeded on this process, the processes first meet at a barrier: a
    process that leaves while another still talks to it (the last gather, the store that
    process 0 serves) can make gloo's threads abort the other in its destructors ("terminate
    called without an active exception", exit -6 after a run that finished). The barrier is
    monitored with a short timeout, so a peer that died after its last collective costs
    `timeout_s`, not the group's timeout. After a failure there is no meeting: the processes
    that failed already agreed on it (`phase`), and one that died must not be waited for."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return
    if succeeded:
        try:
            if dist.get_backend() == "gloo":
                dist.monitored_barrier(timeout=datetime.timedelta(seconds=timeout_s))
            else:
                dist.barrier()
        except Exception as error:  # a peer gone: take the group down all the same
            logger.warning("the processes did not all reach the end of the run together: %s", _describe(error))
    dist.destroy_process_group()


def shard_frozen_trunk(hydra, group: ProcessGroup, device: torch.device) -> int:
    """FSDP2 (torch.distributed.fsdp.fully_shard) for the frozen trunk: every bottom decoder
    layer and every frozen reference copy of a top layer becomes its own FSDP unit over all
    processes, which keeps 1/K of its weights on `device` and gathers the whole layer only
    while it runs. The trainable top layers, heads and the embeddings stay whole on every
    process. Every process must then run those layers the same number of times: equal shares
    of each batch, and generation in lockstep (generation.responses.generate_responses(synced=True)); the
    branch passes of the update skip the bottom layers, so they gather nothing.
    Returns (parameters sharded, of them on this process)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    if (
        hydra.full_model
        or hydra.split_index == 0
        or any(p.requires_grad for layer in hydra.arch.layers[: hydra.split_index] for p in layer.parameters())
    ):
        raise UsageError(
            "train.fsdp_trunk shards the frozen bottom of the trunk, and this model has none: set "
            "model.num_layers_unfrozen to a number of top layers (not -1 or all of them) and lora.lora_layers to top."
        )
    mesh = init_device_mesh(device.type, (group.world_size,))
    frozen = [*hydra.arch.layers[: hydra.split_index], *hydra.ref_layers]
    for layer in frozen:
        fully_shard(layer, mesh=mesh, reshard_after_forward=True)
    params = [p for layer in frozen for p in layer.parameters()]
    return sum(p.numel() for p in params), sum(p.to_local().numel() for p in params)


def gradient_bytes(params) -> int:
    """Bytes one `reduce_gradients` call sends into the all-reduce: the float32 gradients of
    `params` plus the 4-byte flag."""
    return 4 * sum(p.numel() for p in params) + 4


def _process_device(option: str, local_rank: int) -> torch.device:
    """cuda:LOCAL_RANK when CUDA is there (or asked for), else the CPU; one device per process."""
    if option in ("auto", "cuda"):
        if torch.cuda.is_available():
            return torch.device("cuda", local_rank % torch.cuda.device_count())
        if option == "cuda":
            raise UsageError("train.device=cuda but no CUDA device is visible to this process.")
        return torch.device("cpu")
    device = torch.device(option)
    if device.type == "cuda" and device.index is not None:
        raise UsageError(
            f"train.device={option} would put every process of the run on one GPU: use auto or cuda (each process "
            "takes cuda:LOCAL_RANK), and CUDA_VISIBLE_DEVICES to choose the GPUs."
        )
    if device.type not in ("cpu", "cuda"):
        raise UsageError(f"train.device={option}: several processes run on CUDA GPUs or on the CPU only.")
    return device
