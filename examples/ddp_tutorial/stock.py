"""A DDP script in the shape of PyTorch's DDP tutorial (`multinode.py` of pytorch/examples,
distributed/ddp-tutorial-series): `stock.py` for stock torchrun (`torchrun --nproc-per-node=2 stock.py 10 2`),
and `inplace.py`, the same script converted to survive membership changes in place (`diff stock.py
inplace.py`: four imports and the epoch loop; `elastic run examples/ddp_tutorial/job.yaml`). Both take the
same options, which the tests use: a seeded dataset and model, float64 for exact comparisons, a crash of
rank 1 at a chosen batch, the final model saved.
"""

import argparse
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed import destroy_process_group, init_process_group
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler


class SyntheticDataset(Dataset):
    """`size` samples of 20 features and one of 4 classes, the same in every process."""

    def __init__(self, size: int, seed: int, dtype: torch.dtype) -> None:
        self.inputs = torch.randn(size, 20, generator=torch.Generator().manual_seed(seed)).to(dtype)
        self.targets = self.inputs[:, :4].argmax(dim=1)

    def __len__(self) -> int:
        return len(self.inputs)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.inputs[index], self.targets[index]


def ddp_setup() -> torch.device:
    local_rank = int(os.environ["LOCAL_RANK"])
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        init_process_group(backend="nccl")
        return torch.device("cuda", local_rank)
    init_process_group(backend="gloo")
    return torch.device("cpu")


class Trainer:
    def __init__(self, model: torch.nn.Module, train_data: DataLoader, optimizer: torch.optim.Optimizer,
                 save_every: int, snapshot_path: Path, device: torch.device, args: argparse.Namespace) -> None:
        self.device = device
        self.model = model.to(device)
        self.train_data = train_data
        self.optimizer = optimizer
        self.save_every = save_every
        self.snapshot_path = snapshot_path
        self.epochs_run = 0
        self.batches_run = 0
        self.args = args
        if snapshot_path.exists():
            self._load_snapshot(snapshot_path)
        self.model = DDP(self.model, device_ids=[device.index] if device.type == "cuda" else None)

    def _load_snapshot(self, snapshot_path: Path) -> None:
        snapshot = torch.load(snapshot_path, map_location=self.device)
        self.model.load_state_dict(snapshot["MODEL_STATE"])
        self.epochs_run = snapshot["EPOCHS_RUN"]
        print(f"Resuming training from snapshot at epoch {self.epochs_run}")

    def _run_batch(self, source: torch.Tensor, targets: torch.Tensor) -> None:
        self.optimizer.zero_grad()
        loss = F.cross_entropy(self.model(source), targets)
        loss.backward()
        self.optimizer.step()

    def _run_epoch(self, epoch: int) -> None:
        self.train_data.sampler.set_epoch(epoch)
        started, batches = time.perf_counter(), 0
        for source, targets in self.train_data:
            self._maybe_crash()
            time.sleep(self.args.step_seconds)
            self._run_batch(source.to(self.device), targets.to(self.device))
            self.batches_run += 1
            batches += 1
        if dist.get_rank() == 0:
            print(f"epoch={epoch} batches={batches} seconds={time.perf_counter() - started:.4f}", flush=True)

    def _save_snapshot(self, epoch: int) -> None:
        snapshot = {"MODEL_STATE": self.model.module.state_dict(), "EPOCHS_RUN": epoch + 1}
        partial = self.snapshot_path.with_name(f".{self.snapshot_path.name}.{os.getpid()}")
        torch.save(snapshot, partial)
        os.replace(partial, self.snapshot_path)
        print(f"Epoch {epoch} | Training snapshot saved at {self.snapshot_path}")

    def train(self, max_epochs: int) -> None:
        for epoch in range(self.epochs_run, max_epochs):
            self._run_epoch(epoch)
            if dist.get_rank() == 0 and epoch % self.save_every == 0:
                self._save_snapshot(epoch)
        if dist.get_rank() == 0 and self.args.save_final:
            torch.save(self.model.module.state_dict(), self.args.save_final)
        print(f"done rank={dist.get_rank()} batches={self.batches_run} pid={os.getpid()}", flush=True)

    def _maybe_crash(self) -> None:
        """Test hook: rank 1 exits 1 at its batch `--crash-at-batch`, once (the marker file says it did)."""
        marker = self.args.crash_marker
        if self.batches_run != self.args.crash_at_batch or dist.get_rank() != 1 or marker.exists():
            return
        marker.touch()
        print(f"crashing rank=1 batch={self.batches_run} pid={os.getpid()}", flush=True)
        os._exit(1)


def load_train_objs(args: argparse.Namespace) -> tuple[Dataset, torch.nn.Module, torch.optim.Optimizer]:
    dtype = getattr(torch, args.dtype)
    torch.manual_seed(args.seed)
    hidden = args.hidden
    model = torch.nn.Sequential(torch.nn.Linear(20, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, hidden),
                                torch.nn.ReLU(), torch.nn.Linear(hidden, 4)).to(dtype)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    return SyntheticDataset(args.dataset_size, args.seed, dtype), model, optimizer


def prepare_dataloader(dataset: Dataset, batch_size: int, num_workers: int = 0) -> DataLoader:
    return DataLoader(dataset, batch_size=batch_size, pin_memory=torch.cuda.is_available(), shuffle=False,
                      sampler=DistributedSampler(dataset), num_workers=num_workers)


def main(args: argparse.Namespace) -> None:
    device = ddp_setup()
    dataset, model, optimizer = load_train_objs(args)
    train_data = prepare_dataloader(dataset, args.batch_size, args.num_workers)
    trainer = Trainer(model, train_data, optimizer, args.save_every, args.snapshot_path, device, args)
    trainer.train(args.total_epochs)
    destroy_process_group()


def run_path(path: Path) -> Path:
    """A relative path belongs to the run: under $ELASTIC_CHECKPOINT_DIR where the launcher gives one (`elastic
    run` gives every run its own), else under the working directory."""
    base = os.environ.get("ELASTIC_CHECKPOINT_DIR")
    return path if path.is_absolute() or not base else Path(base) / path


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="a DDP training job in the shape of PyTorch's DDP tutorial")
    parser.add_argument("total_epochs", type=int, help="epochs to train")
    parser.add_argument("save_every", type=int, help="epochs between snapshots")
    parser.add_argument("--batch_size", type=int, default=32, help="samples per rank per step (default 32)")
    parser.add_argument("--snapshot-path", type=Path, default=Path("snapshot.pt"))
    parser.add_argument("--dataset-size", type=int, default=2048)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--num-workers", type=int, default=0, help="DataLoader worker processes (they fetch ahead)")
    parser.add_argument("--hidden", type=int, default=64, help="the model's width (1024: 4.3 MB of parameters)")
    parser.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    parser.add_argument("--crash-at-batch", type=int, help="rank 1 exits 1 at this batch of its own, once")
    parser.add_argument("--crash-marker", type=Path, default=Path("crashed"))
    parser.add_argument("--step-seconds", type=float, default=0.0, help="extra time per batch (a slower model)")
    parser.add_argument("--save-final", type=Path, help="rank 0 saves the final model's state_dict here")
    args = parser.parse_args()
    args.snapshot_path, args.crash_marker = run_path(args.snapshot_path), run_path(args.crash_marker)
    args.snapshot_path.parent.mkdir(parents=True, exist_ok=True)
    return args


if __name__ == "__main__":
    main(parse_args())
    sys.stdout.flush()
    os._exit(0)  # past gloo's teardown, which now and then aborts a finished process (see train_inplace.py)
