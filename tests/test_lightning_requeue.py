"""Lightning's own Slurm handling under gq: on the --signal it checkpoints (hpc_ckpt) and
runs ``scontrol requeue $SLURM_JOB_ID``; the job comes back, Lightning resumes from that
checkpoint and the run ends with the loss a run never interrupted ends with."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time
from datetime import datetime

import pytest

from conftest import gq_ok, job, submit, wait_for, wait_state, write_script

# Asked without importing it: importing Lightning costs every test worker 3 s to collect.
if importlib.util.find_spec("pytorch_lightning") is None:
    pytest.skip("pytorch_lightning is not installed", allow_module_level=True)

STEPS = 400
# One fixed batch per epoch (data order cannot differ between runs), served by two fork
# DataLoader workers (which inherit Lightning's handler: a signal that reached them would
# write a checkpoint of their stale trainer). Its first run under gq paces its steps so the
# signal finds it training; the resumed run and the run by hand do not wait. The first run
# takes the signal only in its pace's sleep, before its step's update: Lightning's handler
# saves where it is, and one that ran between the update and Lightning's count of it (the
# hooks' release runs there) saved a model one step ahead of its count, which the resumed
# run then stepped once more (every thread blocks it, the later ones as they inherit it).
# The resumed run gets the signal again at the same time into its run (while it imports,
# trains or after, as the load has it): with requeueing off, Lightning sets no handler of
# its own, so the run keeps one that notes the signal, and waits for it before it ends.
# (It reset the signal to its default before training once, as the first run must, and a
# signal that came then killed it: "killed by signal SIGUSR1" on a loaded machine.)
LIGHT = f"""\
import os, signal
RESUMED = "SLURM_RESTART_COUNT" in os.environ
PACED = "GQ_JOB_ID" in os.environ and not RESUMED
if RESUMED:
    signal.signal(signal.SIGUSR1, lambda *_: open("signalled again", "w").close())
if PACED:
    signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGUSR1])
import sys, time
import torch
import pytorch_lightning as pl
from torch.utils.data import DataLoader, TensorDataset

torch.set_num_threads(1)
PACE = 0.08 if PACED else 0.0


class Tiny(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(8, 1)

    def training_step(self, batch, index):
        if not RESUMED and index == 0 and self.global_step == 0:
            open("training", "w").close()  # the test brings the signal forward from here
        if PACED:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGUSR1])
            time.sleep(PACE)
            signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGUSR1])
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


if __name__ == "__main__":
    torch.manual_seed(0)
    x = torch.randn(32, 8)
    y = x.sum(1, keepdim=True)
    data = DataLoader(TensorDataset(x, y), batch_size=32, num_workers=2,
                      persistent_workers=True, multiprocessing_context="fork")
    model = Tiny()
    # The resumed run keeps its limit, and the signal comes again as far into it: it does
    # not requeue itself a second time (its signal ignored, as set above).
    from pytorch_lightning.plugins.environments import SLURMEnvironment
    plugins = [SLURMEnvironment(auto_requeue=False)] if RESUMED else []
    trainer = pl.Trainer(max_steps={STEPS}, default_root_dir=os.getcwd(), logger=False,
                         plugins=plugins,
                         enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, accelerator="cpu", devices=1)
    if not RESUMED:
        signal.signal(signal.SIGUSR1, signal.SIG_DFL)  # Lightning sets its own over the default
    trainer.fit(model, data)
    while RESUMED and not os.path.exists("signalled again"):
        time.sleep(0.05)
    with torch.no_grad():
        loss = torch.nn.functional.mse_loss(model.layer(x), y).item()
    print(f"final {{loss:.10e}} after {{trainer.global_step}} steps", flush=True)
"""


@pytest.mark.long
def test_lightning_requeues_itself_on_the_signal_and_resumes_to_the_same_loss(daemon, tmp_path):
    import torch

    script = write_script(tmp_path / "light.py", LIGHT)
    # The signal once it trains (Lightning's imports took 5 s alone, over 25 s under load):
    # its limit lowered then, to bring the signal due at once.
    job_id = submit("-t", "10:00", "--signal", "USR1@35", "--requeue", str(script))
    bare = tmp_path / "bare"
    bare.mkdir()
    # The run by hand beside it, not before: on a loaded machine it took as long as the
    # paced run, which had ended before its limit could be lowered.
    by_hand = subprocess.Popen(
        [sys.executable, str(script)],
        cwd=bare,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={k: v for k, v in os.environ.items() if not k.startswith(("GQ_", "SLURM_"))},
    )
    try:
        wait_for((tmp_path / "training").exists, 120, what="the first run training")
        started = datetime.fromisoformat(job(job_id)["start_time"]).timestamp()
        limit = int(time.time() - started) + 37  # the signal due within 2 s
        gq_ok("update", str(job_id), "-t", f"{limit // 60}:{limit % 60:02d}")
        by_hand_out, by_hand_err = by_hand.communicate(timeout=120)
    finally:
        by_hand.kill()  # (a no-op once it has ended)
        by_hand.wait()
    assert by_hand.returncode == 0, by_hand_err
    info = wait_state(job_id, "COMPLETED", timeout=120)
    out = (tmp_path / f"gq-{job_id}.out").read_text()
    assert info["run_count"] == 2, out  # requeued once, by Lightning's own scontrol call
    # Lightning's own scontrol call requeued it (whether it lived to log so races with the
    # stop that requeue sets off: the killed DataLoader workers raise in its handler).
    assert f"requeing job {10**10 + job_id}" in out and "scontrol: not found" not in out, out
    assert "requeued by user" in [event["reason"] for event in info["events"]]
    saved = sorted(path.name for path in tmp_path.glob("hpc_ckpt_*.ckpt"))
    assert saved == ["hpc_ckpt_1.ckpt"], saved  # by the script, none by a worker
    step = torch.load(tmp_path / saved[0], weights_only=False)["global_step"]
    assert 0 < step < STEPS, step  # the step it had reached, not a stale trainer's 0
    assert f"Restored all states from the checkpoint at {tmp_path / saved[0]}" in out
    assert (tmp_path / "signalled again").exists()  # the resumed run took it and lived
    final = [line for line in out.splitlines() if line.startswith("final ")]
    assert final == [line for line in by_hand_out.splitlines() if line.startswith("final ")]
    assert final[0].endswith(f"after {STEPS} steps")
