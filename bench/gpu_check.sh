#!/usr/bin/env bash
# The GPU check of issue 45: in place on CUDA, through a worker crash, a node loss and a scale-up (and HSDP
# 2 x 2 through worker crashes), timed by bench/recovery.py --hot beside restart mode, in one run. Run it on a
# machine with torch's CUDA build:
#
#   bash bench/gpu_check.sh            # 2 agents, 1 worker each, the 101 MB model, 3 incidents per scenario
#
# Worker k trains on GPU k modulo the GPUs there are. NCCL refuses two ranks on one GPU, so with fewer GPUs
# than ranks the training group is gloo over the CUDA tensors (the commit gate and the state handover are
# gloo in any case) and the script says so; with a GPU per rank it is NCCL, which the session aborts when a
# round ends under a pending collective (TORCH_NCCL_ASYNC_ERROR_HANDLING=0 in place). Prints the bench's
# tables and RESULT lines; the log of a failed job is kept and named.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
RANKS=${RANKS:-2}
INCIDENTS=${INCIDENTS:-3}

"$PY" - <<'PYEOF'
import torch, torch.distributed as dist
assert torch.cuda.is_available(), "no usable GPU: this check needs torch's CUDA build and a GPU"
print(f"torch {torch.__version__}, {torch.cuda.device_count()} GPU(s): {torch.cuda.get_device_name(0)}, "
      f"NCCL built in: {dist.is_nccl_available()}")
PYEOF
GPUS=$("$PY" -c 'import torch; print(torch.cuda.device_count())')
if [ "$GPUS" -ge "$RANKS" ]; then BACKEND=nccl; else BACKEND=gloo; fi
echo "gpu_check: $RANKS ranks on $GPUS GPU(s): the training group is $BACKEND"

"$PY" bench/recovery.py --hot --device cuda --backend "$BACKEND" --sizes "$RANKS" --incidents "$INCIDENTS" \
  --blocks 1 --scenarios worker_crash,node_loss,scale_up --variants in-place,in-place-ddp,restart --timeout 60

# HSDP (FSDP2 over replicas of 2 ranks) needs 4 ranks for a 2 x 2 mesh; worker crashes only (design 3.25).
if [ "$GPUS" -ge 4 ]; then HSDP_BACKEND=nccl; else HSDP_BACKEND=gloo; fi
echo "gpu_check: HSDP 2 x 2 on $GPUS GPU(s): the training group is $HSDP_BACKEND"
"$PY" bench/recovery.py --hot --device cuda --backend "$HSDP_BACKEND" --sizes 4 --incidents "$INCIDENTS" \
  --blocks 1 --scenarios worker_crash --variants in-place,in-place-hsdp,restart --timeout 60
